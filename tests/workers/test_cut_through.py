"""Cut-through from the trainer to every actor, as real processes: two actors in a remote region prefetch
each version's segments from their relay's hot cache as the relay receives them, before the regional
manifest exists, and still end on exactly the trainer's weights."""

from __future__ import annotations

import json
import statistics

import pytest

from workers.chaos.harness import events, fast_spec
from workers.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]

STEPS = 8


def test_remote_actors_read_their_relays_cache_and_end_on_the_trainers_digest(tmp_path):
    # A warm start: from a policy that never earns a reward every gradient is zero and every delta empty, and
    # there is nothing to relay (an untrained policy earns none in a step about a third of the time).
    spec = fast_spec(tmp_path, steps=STEPS, actors={"us-east": 1, "eu-west": 2},
                     trainer_args=["--warm-start-steps", "20"])
    with LocalCluster(spec) as cluster:
        summary = cluster.wait_trainer_done(300)
        final = summary["trainer_version"]
        remote = [a for a in cluster.actor_ids if a.startswith("eu-west")]
        states = cluster.wait_for(
            lambda: (s := {a: st for a, (st, _) in cluster.plane.actors().items()}) and
            all(s.get(a) is not None and s[a].active_version == final for a in cluster.actor_ids) and s,
            90, "actors on the final version")
        relay = cluster.wait_for(lambda: cluster.plane.relay("eu-west"), 10, "the relay's state")
        log = cluster.plane.run_log()
        store = cluster.store()
        published = {v: len(store.manifest(v).segments) for v in store.versions()}
    # What the relay did, for any failure below to explain itself.
    facts = {"relay": relay, "segments_per_version": published,
             "relay_forwards": [(e["version"], e["segments"], e["bytes"]) for e in events(log, "relay_forward")]}
    assert any(published.values()), f"every delta was empty: nothing to relay, the test proves nothing {facts}"
    for actor in cluster.actor_ids:
        assert (states[actor].active_version, states[actor].active_digest) == (final, summary["trainer_digest"])
    assert relay.cache_url and relay.cache_url.startswith("http://127.0.0.1:")
    stages = {a: [e for e in events(log, "stage") if e["actor"] == a] for a in remote}
    last = {a: stages[a][-1] for a in remote}
    cache_bytes = {a: int(last[a]["cache_bytes"]) for a in remote}
    used = {a: int(last[a]["prefetch_used_bytes"]) for a in remote}
    assert relay.cache_hits > 0, f"the relay's cache served nobody: {facts}"
    assert all(n > 0 for n in cache_bytes.values()), \
        f"a remote actor never read the relay's cache: {cache_bytes} {facts}"
    assert all(n > 0 for n in used.values()), f"a remote actor never staged prefetched segments: {used} {facts}"
    # The relay announced segments on the region's stream before it forwarded the manifest.
    # (Actors never activate anything that does not hash to the manifest's digest: --verify-full-digest.)
    # Decode-ahead: segments of the version after the active one were decoded before its manifest, for every
    # version after the first (the codec comes from a verified manifest).
    decoded_ahead = {a: sum(int(e.get("decoded_ahead", 0)) for e in stages[a]) for a in remote}
    assert all(n > 0 for n in decoded_ahead.values()), f"a remote actor never decoded ahead: {decoded_ahead} {facts}"
    after_manifest = [float(e["after_manifest_s"]) for a in remote for e in stages[a]]
    ahead_only = [float(e["after_manifest_s"]) for a in remote for e in stages[a]
                  if int(e.get("segments", 0)) and int(e["decoded_ahead"]) == int(e["segments"])]
    print(json.dumps({
        "relay_cache_hits": relay.cache_hits, "relay_cache_misses": relay.cache_misses,
        "relay_bytes_copied": relay.bytes_copied, "actor_cache_bytes": cache_bytes,
        "actor_bucket_bytes": {a: int(last[a]["bucket_bytes"]) for a in remote},
        "actor_prefetched_bytes": {a: int(last[a]["prefetched_bytes"]) for a in remote},
        "actor_prefetch_used_bytes": used,
        "actor_prefetch_dropped_bytes": {a: int(last[a]["prefetch_dropped_bytes"]) for a in remote},
        "actor_decoded_ahead": decoded_ahead,
        "actor_segments_staged": {a: sum(int(e.get("segments", 0)) for e in stages[a]) for a in remote},
        "stages": len(after_manifest), "after_manifest_s_median": round(statistics.median(after_manifest), 4),
        "after_manifest_s_max": round(max(after_manifest), 4),
        "stages_all_decoded_ahead": len(ahead_only),
        "all_decoded_ahead_after_manifest_s_median": round(statistics.median(ahead_only), 4) if ahead_only else None,
        "all_decoded_ahead_after_manifest_s_max": round(max(ahead_only), 4) if ahead_only else None,
        "rows": [(e["version"], e.get("segments"), e.get("decoded_ahead"), e["after_manifest_s"])
                 for e in stages[remote[0]]]}))
