"""A relay that rewrites deltas (changed value bits, re-hashed segments, a re-computed weights digest) is
refused by every actor of its region — whose weights stay on the trainer's versions — and the run
continues from the untampered source bucket."""

from __future__ import annotations

import threading

import pytest

from aurora_store.bus import VersionEvent
from aurora_store.codec import CodecParams, DeltaEncoder, DeltaManifest, TensorTarget, pieces_from_states
from aurora_store.codec.layout import bits_view
from aurora_store.follow import follow, plan_catch_up
from aurora_store.store import object_names
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from workers.cluster import ClusterSpec, LocalCluster
from workers.relay.cli import parse_args
from workers.relay.relay import Relay

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def reconstruct(store, layout, version):
    plan = plan_catch_up(None, version, {v: store.delta_bytes(v) for v in store.versions()},
                         {s: read_snapshot_manifest(store, s).total_bytes for s in store.snapshot_versions()})
    state, _ = load_snapshot(store, plan.snapshot, layout)
    target = TensorTarget.from_state(layout, state, version=plan.snapshot)
    follow(store, target, plan.target, snapshots=False)
    return state, target.digest


class ForgingRelay(Relay):
    """Forwards version 1 honestly, then forges every later delta: one element's value bits changed,
    segments re-encoded (so their SHA-256 names are right), the weights digest re-computed for the forged
    weights — everything an attacker without the trainer's key can do. The trainer's signature is kept."""

    forged: list[int]

    def forward_version(self, version: int) -> None:
        if version < 2 or version in self.forwarded:
            return super().forward_version(version)
        real = self.source.manifest(version)
        layout = self.source.layout(real.layout_fingerprint)
        base, base_digest = reconstruct(self.source, layout, version - 1)
        new, _ = reconstruct(self.source, layout, version)
        name = layout.train_names[0]
        bits = bits_view(new[name])
        bits[7] ^= 0x0001  # the tampering: one element, lowest mantissa bit
        encoder = DeltaEncoder(layout, CodecParams(segment_bytes=4096))
        segments = list(encoder.segments(pieces_from_states(layout, base, new)))
        for segment in segments:
            self.dest.put_segment(segment.ref, segment.data)
        forged = DeltaManifest(version=version, base_version=version - 1, layout_fingerprint=layout.fingerprint,
                               codec=encoder.params, segments=tuple(s.ref for s in segments),
                               changed=encoder.summary.changed, elements=layout.numel,
                               base_weights_digest=str(base_digest),
                               weights_digest=str(base_digest + encoder.summary.digest_delta),
                               created_at=real.created_at, producer=dict(real.producer), signature=real.signature)
        self.dest.put_layout(layout)
        self.dest.publish_manifest(forged)
        self.forwarded.add(version)
        self.forged.append(version)
        self.plane.announce(VersionEvent("staged", version, self.config.region, base=version - 1,
                                         manifest_key=object_names.delta(version),
                                         weights_digest=forged.weights_digest))


def test_forged_deltas_are_refused_and_the_run_continues_from_the_source(tmp_path):
    spec = ClusterSpec(run_dir=tmp_path, steps=6, batch_size=16, group_size=4, actors={"us-east": 1, "eu-west": 2},
                       env={"AURORA_HEARTBEAT_TTL": "3"}, actor_args=["--verify-full-digest"])
    cluster = LocalCluster(spec)
    cluster.redis.start()
    try:
        cluster.start_trainer()
        cluster.start_actor("us-east-1", "us-east")
        for i in (1, 2):
            cluster.start_actor(f"eu-west-{i}", "eu-west")
        relay = ForgingRelay(parse_args([
            "--source", cluster.buckets["us-east"], "--dest", cluster.buckets["eu-west"], "--region", "eu-west",
            "--redis", cluster.redis.url, "--run", spec.run, *cluster.commands.trust]))
        relay.forged = []
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        cluster.connect()
        summary = cluster.wait_trainer_done(300)
        final = summary["trainer_version"]
        cluster.wait_actors_on(final, 60)
        log = cluster.plane.run_log()
        relay.stopping.set()
        thread.join(timeout=10)
        assert relay.forged, "the relay forged nothing"
        refused = {(e["actor"], int(e["version"])) for e in log if e.get("kind") == "refetch_source"}
        # Every remote actor met forged deltas and refused them (a version it fetched while its relay looked
        # dead came from the source bucket directly, which is fine too).
        for actor_id in ("eu-west-1", "eu-west-2"):
            assert any((actor_id, v) in refused for v in relay.forged), (actor_id, refused)
        source = cluster.store()
        for actor_id, (state, _) in cluster.plane.actors().items():
            assert state.active_digest == source.manifest(state.active_version).weights_digest, actor_id
        for entry in (e for e in log if e.get("kind") == "activate"):
            assert entry["digest"] == source.manifest(int(entry["version"])).weights_digest
        assert summary["rollouts_accepted"] == 6 * 16
        # the forged manifests are still in the regional bucket, and verification names them
        from aurora_store.ops.verify import verify_bucket
        from aurora_store.trust import Verifier

        report = verify_bucket(cluster.buckets["eu-west"], verify_manifest=Verifier.load(str(cluster.public_key)))
        assert not report.ok and any(p.version in relay.forged for p in report.problems)
    finally:
        cluster.stop()
