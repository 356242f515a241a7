"""The chaos scenarios: spot preemption, joins, lag, lag past a gc, relay loss, Redis loss, flaky storage,
trainer restart, heterogeneous actors and a hostile actor — each against real processes, a real Redis and real
buckets."""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.testing.servers import S3Server, environment
from workers.chaos.faultproxy import FaultProxy, FaultRates
from workers.chaos.harness import (
    ScenarioResult,
    events,
    fast_spec,
    finish,
    longest_stall,
    ms,
    now_ms,
    wait_actor_ready,
    wait_version,
)
from workers.chaos.hostile import HostileActor
from workers.chaos.notifier import HostileNotifier
from workers.cluster import LocalCluster
from workers.launch import Managed

Scenario = Callable[[Path, bool], ScenarioResult]


def _dispatch_with(cluster: LocalCluster, actor: str, after_ms: int) -> dict | None:
    """The first dispatch after ``after_ms`` that gave ``actor`` at least one lease."""
    for entry in events(cluster.plane.run_log(), "dispatch"):
        if ms(entry) >= after_ms and json.loads(entry.get("shares") or "{}").get(actor, 0) > 0:
            return entry
    return None


def _slow_victim_spec(run_dir: Path, steps: int):
    # A uniform split and an emulated 10 tokens/s victim that takes one lease at a time: whenever it is hit,
    # it still holds unfinished leases (the point of both preemption scenarios).
    # The survivors' emulated 150 tokens/s give every step a floor duration (~1 s), so on a fast machine the
    # run still lasts until the late-starting victim holds leases.
    return fast_spec(run_dir, steps=steps, actors={"us-east": 2}, trainer_args=["--split", "uniform"],
                     actor_args=["--sim-tokens-per-s", "150"])


def kill_actor_mid_batch(run_dir: Path, quick: bool) -> ScenarioResult:
    """An actor is SIGKILLed right after receiving leases: they expire back to the pool within one lease
    duration, the survivors complete the step, and nobody pauses."""
    steps = 10 if quick else 14
    result = ScenarioResult("kill_actor_mid_batch", ["SIGKILL actor us-east-3 holding leases"])
    with LocalCluster(_slow_victim_spec(run_dir, steps)) as cluster:
        cluster.start_actor("us-east-3", "us-east", ["--sim-tokens-per-s", "10", "--batch-size", "1"])
        wait_version(cluster, 2)
        mark = now_ms()
        cluster.wait_for(lambda: _dispatch_with(cluster, "us-east-3", mark), 60, "leases for the victim")
        cluster.group["actor-us-east-3"].kill()
        killed = now_ms()
        summary = cluster.wait_trainer_done(300)
        log = cluster.plane.run_log()
        expiries = [e for e in events(log, "expire") if "us-east-3" in e.get("actors", "") and ms(e) >= killed]
        lease_ms = max(int(e["lease_ms"]) for e in events(log, "dispatch") if ms(e) <= killed)
        recovered = (ms(expiries[0]) - killed) / 1000 if expiries else None
        result.longest_stall_s = longest_stall(log, ["us-east-1", "us-east-2"], killed, ms(log[-1]))
        result.figures = {"lease_duration_s": lease_ms / 1000, "leases_back_in_pool_after_s": recovered,
                          "expired_leases": sum(int(e["leases"]) for e in expiries)}
        result.invariants["leases_expired_within_one_lease_duration"] = (recovered is not None and
                                                                       recovered <= lease_ms / 1000 + 1.0)
        finish(result, cluster, summary, log, expected_steps=steps, expected_dead={"us-east-3"})
        result.invariants["survivors_never_paused"] = result.longest_stall_s <= lease_ms / 1000 + 5.0
    return result


def sigterm_actor(run_dir: Path, quick: bool) -> ScenarioResult:
    """A preemption notice (SIGTERM): the actor hands its leases back at once and deregisters."""
    steps = 8 if quick else 14
    result = ScenarioResult("sigterm_graceful_leave", ["SIGTERM actor us-east-3 holding leases"])
    with LocalCluster(_slow_victim_spec(run_dir, steps)) as cluster:
        # Slow enough to hold queued leases when the notice comes, fast enough not to lose them to expiry.
        cluster.start_actor("us-east-3", "us-east", ["--sim-tokens-per-s", "40", "--batch-size", "1"])
        wait_version(cluster, 2)
        mark = now_ms()
        cluster.wait_for(lambda: _dispatch_with(cluster, "us-east-3", mark), 60, "leases for the leaver")
        victim = cluster.group["actor-us-east-3"]
        victim.process.send_signal(signal.SIGTERM)
        sent = now_ms()
        victim.process.wait(timeout=60)
        summary = cluster.wait_trainer_done(300)
        log = cluster.plane.run_log()
        leave = [e for e in events(log, "actor_leave") if e.get("actor") == "us-east-3"]
        expired = [e for e in events(log, "expire") if "us-east-3" in e.get("actors", "") and ms(e) >= sent]
        result.figures = {"exit_code": victim.process.returncode,
                          "returned_leases": int(leave[0]["returned"]) if leave else None,
                          "leave_after_s": (ms(leave[0]) - sent) / 1000 if leave else None,
                          "leases_returned_total": summary.get("leases_returned"), "expired_of_leaver": len(expired)}
        result.invariants["left_gracefully"] = victim.process.returncode == 0 and bool(leave)
        result.invariants["returned_leases_repooled"] = (summary.get("leases_returned") or 0) > 0
        result.invariants["leases_returned_not_expired"] = not expired
        result.longest_stall_s = longest_stall(log, ["us-east-1", "us-east-2"], sent, ms(log[-1]))
        finish(result, cluster, summary, log, expected_steps=steps, expected_dead={"us-east-3"})
    return result


def actor_joins_mid_run(run_dir: Path, quick: bool) -> ScenarioResult:
    """A new actor joins: snapshot + catch-up replay, eligible within a step, bytes as planned."""
    steps = 30 if quick else 40
    result = ScenarioResult("actor_joins_mid_run", ["start actor us-east-3 after version 6"])
    # Emulated 150 tokens/s actors give every step a floor duration, so the run outlasts the joiner's start.
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 2}, snapshot_every=5,
                     actor_args=["--sim-tokens-per-s", "150"])
    with LocalCluster(spec) as cluster:
        wait_version(cluster, 6)
        cluster.start_actor("us-east-3", "us-east", env={})
        joined = now_ms()
        summary = cluster.wait_trainer_done(300)
        log = cluster.plane.run_log()
        boot = [e for e in events(log, "actor_bootstrap") if e.get("actor") == "us-east-3"]
        ready = next((e for e in events(log, "actor_ready") if e.get("actor") == "us-east-3"), None)
        first = next((e for e in events(log, "settle") if e.get("actor") == "us-east-3" and e["accepted"] == "1"),
                     None)
        after_ready = [e for e in events(log, "dispatch") if ready and ms(e) >= ms(ready)]
        shared = next((i for i, e in enumerate(after_ready)
                       if json.loads(e.get("shares") or "{}").get("us-east-3", 0) > 0), None)
        first_share = after_ready[shared] if shared is not None else None
        # Caught up: at a dispatch, the joiner's active version (ready, then each activation) is the version
        # being dispatched. Counted from there, so a fast trainer that moved on during the joiner's start-up
        # (it must replay those versions first, legitimately excluded meanwhile) is not held against it.
        activations = [(ms(ready), int(ready["version"]))] if ready else []
        activations += [(ms(e), int(e["version"])) for e in events(log, "activate") if e.get("actor") == "us-east-3"]
        caught = next((i for i, e in enumerate(after_ready)
                       if max((v for t, v in activations if t <= ms(e)), default=-1) >= int(e["version"])), None)
        waited = None if shared is None else max(shared - (caught if caught is not None else shared), 0)
        step_s = statistics.median(float(e["wait_s"]) + float(e["train_s"]) + float(e["publish_s"])
                                   for e in events(log, "step")) if events(log, "step") else 1.0
        b = boot[0] if boot else {}
        result.figures = {"snapshot": b.get("snapshot"), "deltas_replayed": b.get("deltas"),
                          "planned_bytes": b.get("planned_bytes"), "downloaded_bytes": b.get("downloaded_bytes"),
                          "bootstrap_s": (ms(b) - joined) / 1000 if b else None,
                          "first_leases_after_ready_s": (ms(first_share) - ms(ready)) / 1000
                          if first_share and ready else None, "dispatches_after_ready_before_leases": shared,
                          "dispatches_after_caught_up_before_leases": waited,
                          "first_accepted_after_bootstrap_s": (ms(first) - ms(b)) / 1000 if first and b else None,
                          "median_step_s": step_s}
        result.invariants["downloaded_bytes_match_plan"] = bool(b) and b["planned_bytes"] == b["downloaded_bytes"]
        result.invariants["bootstrapped_from_a_snapshot"] = bool(b) and int(b["snapshot"]) >= 5
        # Once caught up it gets work at the first or second dispatch after that (one step).
        result.invariants["eligible_within_one_step"] = waited is not None and waited <= 1 and first is not None
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


def actor_falls_behind(run_dir: Path, quick: bool) -> ScenarioResult:
    """An actor is frozen (SIGSTOP) while ≥2 versions are published: it is excluded, its throughput estimate
    decays, it replays only the missed deltas and rejoins."""
    steps = 16 if quick else 20
    result = ScenarioResult("actor_falls_behind", ["SIGSTOP actor us-east-3 for ≥3 versions, then SIGCONT"])
    # A long heartbeat TTL: the frozen actor stays registered, as when only its bucket link is partitioned,
    # so the scheduler sees it fall behind (and excludes it) instead of seeing it vanish.
    # A floor on step duration (emulated 100 tokens/s: ~1 s steps) leaves ≥10 steps after the thaw, more
    # than the thawed actor needs to replay what it missed (~5 s on a busy 2-core machine), on any machine.
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 3}, env={"AURORA_HEARTBEAT_TTL": "60"},
                     actor_args=["--sim-tokens-per-s", "100"])
    with LocalCluster(spec) as cluster:
        wait_version(cluster, 2)
        wait_actor_ready(cluster, "us-east-3")
        victim = cluster.group["actor-us-east-3"]
        before = cluster.plane.actors()["us-east-3"][0]
        os.kill(victim.process.pid, signal.SIGSTOP)
        frozen_at, frozen_version = now_ms(), cluster.trainer_version()
        wait_version(cluster, frozen_version + 3)
        resumed = _thaw(victim)
        summary = cluster.wait_trainer_done(300)
        log = cluster.plane.run_log()
        store = cluster.store()
        excluded = [e for e in events(log, "dispatch") if '"us-east-3"' in e.get("excluded", "")]
        rejoined = [e for e in events(log, "settle") if e.get("actor") == "us-east-3" and e["accepted"] == "1"
                    and ms(e) >= resumed]
        back = ms(rejoined[0]) if rejoined else ms(log[-1])
        catch_up = [e for e in events(log, "activate") if e.get("actor") == "us-east-3" and resumed <= ms(e) <= back]
        boots = [e for e in events(log, "actor_bootstrap") if e.get("actor") == "us-east-3"]
        missed = [int(e["version"]) for e in catch_up]
        estimates = [e for e in events(log, "dispatch") if ms(e) >= resumed and '"us-east-3"' in e.get("estimates", "")]
        earlier = [e for e in events(log, "dispatch") if ms(e) < frozen_at and '"us-east-3"' in e.get("estimates", "")]
        tau_before = json.loads(earlier[-1]["estimates"])["us-east-3"] if earlier else None
        tau_rejoin = json.loads(estimates[0]["estimates"])["us-east-3"] if estimates else None
        plans = [e for e in events(log, "catch_up") if e.get("actor") == "us-east-3" and ms(e) >= resumed]
        result.figures = {"frozen_s": (resumed - frozen_at) / 1000, "frozen_at_version": frozen_version,
                          "versions_missed": len(missed), "rejoined_after_s": (back - resumed) / 1000,
                          "replayed_versions": missed, "steps_excluded": len(excluded),
                          "replayed_bytes": sum(store.delta_bytes(v) for v in missed),
                          "rejoined_results": len(rejoined), "tokens_per_s_before": before.tokens_per_s,
                          "first_estimate_after_rejoin": estimates[0]["estimates"] if estimates else None,
                          "tau_before_freeze": tau_before, "tau_at_rejoin": tau_rejoin,
                          "catch_up_plans": [{k: e.get(k) for k in ("cause", "path", "version", "goal", "snapshot",
                                                                     "bytes", "replay_bytes")} for e in plans[:3]]}
        result.invariants["excluded_while_behind"] = len(excluded) >= 1
        # Replay or the newest snapshot, whichever is fewer bytes (this tiny model's deltas are dense, so a
        # few missed deltas can cost more than a snapshot); never a restart, versions applied in order.
        result.invariants["caught_up_by_the_cheaper_path"] = len(boots) == 1 and len(missed) >= 1 and \
            missed == sorted(missed) and all(e["replay_bytes"] == "" or int(e["bytes"]) <= int(e["replay_bytes"])
                                             for e in plans)
        # The paper's α: excluded steps decay τ, and the rejoining actor starts from the decayed estimate.
        result.invariants["rejoined_at_the_decayed_estimate"] = (tau_before is not None and tau_rejoin is not None
                                                                 and tau_rejoin <= 0.5 * tau_before + 1e-6)
        result.invariants["rejoined"] = len(rejoined) > 0
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


def _metric(cluster: LocalCluster, process: str, name: str) -> dict[str, float]:
    """Samples of one Prometheus series family of a process, by their label text."""
    port = cluster.metrics_port(process)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            labels, _, value = line.partition(" ")
            out[labels.removeprefix(name)] = float(value)
    return out


def gc_during_lag(run_dir: Path, quick: bool) -> ScenarioResult:
    """An actor is frozen (SIGSTOP) while the trainer publishes past a snapshot and a gc deletes every delta
    up to it — the frozen actor's next deltas included. Thawed, the actor finds the delta it needs gone,
    plans by bytes, loads the snapshot through the staged, verified path, replays from there and rejoins on
    the trainer's digest; no rollout is accepted from the wrong weights."""
    steps = 16 if quick else 20
    result = ScenarioResult("gc_during_lag", ["SIGSTOP actor us-east-3", "aurora gc --keep-snapshots 1 on the home "
                                              "bucket (deletes the frozen actor's next deltas)", "SIGCONT"])
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 3}, snapshot_every=4, metrics=True,
                     env={"AURORA_HEARTBEAT_TTL": "60"}, actor_args=["--sim-tokens-per-s", "100"])
    from aurora_store.ops.gc import GcRefusedError, collect_garbage

    with LocalCluster(spec) as cluster:
        wait_version(cluster, 2)
        wait_actor_ready(cluster, "us-east-3")
        # Frozen while caught up: an actor already behind may have planned (and staged) a snapshot before the
        # freeze, and would then never meet the missing delta this scenario is about (seen on a loaded machine).
        cluster.wait_for(lambda: _active_version(cluster, "us-east-3") >= cluster.trainer_version() - 1, 120,
                         "actor us-east-3 caught up before the freeze")
        victim = cluster.group["actor-us-east-3"]
        os.kill(victim.process.pid, signal.SIGSTOP)
        frozen_at = now_ms()
        published = cluster.trainer_version()
        frozen_version = _active_version(cluster, "us-east-3")
        # The first snapshot past everything the frozen actor holds or may have staged in memory: nothing newer
        # than what the trainer had published when it stopped (nor than the version after its active one).
        snapshot = (max(published, frozen_version + 1) + 1 + 3) // 4 * 4
        store = cluster.store()
        cluster.wait_for(lambda: snapshot in store.snapshot_versions(), 300, f"snapshot {snapshot}")
        report = None
        for _ in range(10):  # a publish in flight can make gc refuse (it re-checks the kept chain): retry
            try:
                report = collect_garbage(store, keep_snapshots=1)
                break
            except GcRefusedError:
                time.sleep(0.5)
        collected = report.plan.removed_deltas if report else ()
        wait_version(cluster, cluster.trainer_version() + 1)
        resumed = _thaw(victim)
        summary = cluster.wait_trainer_done(300)
        final = (summary["trainer_version"], summary["trainer_digest"])
        on_final = cluster.wait_for(
            lambda: (lambda s: s is not None and (s.active_version, s.active_digest) == final)(
                cluster.plane.actors().get("us-east-3", (None, None))[0]), 60,
            "the thawed actor on the trainer's final version", required=False)
        decisions = _metric(cluster, "actor-us-east-3", "aurora_catch_up_decisions_total")
        log = cluster.plane.run_log()
        plans = [e for e in events(log, "catch_up") if e.get("actor") == "us-east-3" and ms(e) >= resumed]
        snapshot_plans = [e for e in plans if e["path"] == "snapshot"]
        activations = [e for e in events(log, "activate") if e.get("actor") == "us-east-3" and ms(e) >= resumed]
        rejoined = [e for e in events(log, "settle") if e.get("actor") == "us-east-3" and e["accepted"] == "1"
                    and ms(e) >= resumed]
        wrong = [e for e in events(log, "settle") if e.get("actor") == "us-east-3" and e["accepted"] == "1"
                 and (e.get("version"), e.get("digest")) != (e.get("job_version"), e.get("job_digest"))]
        boots = [e for e in events(log, "actor_bootstrap") if e.get("actor") == "us-east-3"]
        loaded = int(snapshot_plans[0]["snapshot"]) if snapshot_plans else None
        result.figures = {"frozen_s": (resumed - frozen_at) / 1000, "frozen_at_version": frozen_version,
                          "gc_removed_deltas": [min(collected), max(collected)] if collected else [],
                          "gc_bytes_freed": report.plan.bytes_freed if report else None,
                          "plans_after_thaw": [{k: e.get(k) for k in ("cause", "path", "version", "goal", "snapshot",
                                                                       "bytes", "replay_bytes")} for e in plans[:4]],
                          "catch_up_metric": decisions,
                          "first_versions_activated_after_thaw": [int(e["version"]) for e in activations[:4]],
                          "rejoined_after_s": (ms(rejoined[0]) - resumed) / 1000 if rejoined else None,
                          "rejoined_results": len(rejoined)}
        result.invariants["gc_removed_the_frozen_actors_next_delta"] = frozen_version + 1 in collected
        # Thawed, it learns of newer versions (cause "behind") or first fails to fetch its next delta ("missing"):
        # either way the plan must see that replay is impossible and pick a snapshot.
        result.invariants["planned_a_snapshot_because_deltas_were_gone"] = bool(snapshot_plans) and \
            snapshot_plans[0]["replay_bytes"] == ""
        result.invariants["decision_counted_in_metric"] = sum(
            v for k, v in decisions.items() if 'path="snapshot"' in k) >= len(snapshot_plans) >= 1
        # A version the actor had already staged (verified) before it was frozen may be activated first at
        # the next batch boundary; after it, the snapshot, then the chain one version at a time.
        after = [e for e in activations if int(e["version"]) > frozen_version + 1]
        result.invariants["activated_the_snapshot_then_replayed"] = loaded is not None and bool(after) and \
            int(after[0]["version"]) == loaded and all(int(b["version"]) == int(a["version"]) + 1
                                                       for a, b in itertools.pairwise(after))
        result.invariants["rejoined_without_restart"] = len(boots) == 1 and len(rejoined) > 0
        result.invariants["on_the_trainers_digest"] = bool(on_final)
        result.invariants["no_wrongly_accepted_rollout"] = not wrong
        finish(result, cluster, summary, log, expected_steps=steps, collected_through=max(collected, default=0))
    return result


def _thaw(process: Managed) -> int:
    """SIGCONT ``process``; the wall-clock ms just *before* it, which every event the process logs once thawed
    is at or after. Read after the signal, a busy test process may read it only once the thawed process has
    already logged its first events (seen: a catch-up plan logged before a late ``resumed``)."""
    resumed = now_ms()
    os.kill(process.process.pid, signal.SIGCONT)
    return resumed


def _active_version(cluster: LocalCluster, actor_id: str) -> int:
    """The actor's active version as it last reported it (-1: not registered or nothing active)."""
    state = cluster.plane.actors().get(actor_id, (None, None))[0]
    return -1 if state is None or state.active_version is None else state.active_version


def relay_dies(run_dir: Path, quick: bool) -> ScenarioResult:
    """The region's relay is killed: its actors fall back to the source bucket and keep producing; a
    restarted relay resumes without re-copying what the regional bucket already holds."""
    steps = 16 if quick else 20
    result = ScenarioResult("relay_dies", ["SIGKILL relay-eu-west", "restart relay-eu-west"])
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 1, "eu-west": 2},
                     actor_args=["--sim-tokens-per-s", "150"])
    with LocalCluster(spec) as cluster:
        wait_version(cluster, 2)
        cluster.group["relay-eu-west"].kill()
        killed, killed_version = now_ms(), cluster.trainer_version()
        cluster.wait_for(lambda: [e for e in events(cluster.plane.run_log(), "source_switch") if e["fallback"] == "1"],
                         60, "fallback to the source bucket")
        # Keep the relay down until the region's actors have produced on the fallback (the point of the
        # scenario) and the region has fallen a few versions behind (something for the restarted relay to do).
        cluster.wait_for(lambda: [e for e in events(cluster.plane.run_log(), "settle")
                                  if e.get("actor", "").startswith("eu-west") and e["accepted"] == "1"
                                  and ms(e) >= killed], 90, "remote results while the relay is down")
        wait_version(cluster, killed_version + 3)
        regional = cluster.store("eu-west")
        held = set(regional.versions())
        missing_bytes = sum(cluster.store().manifest(v).segment_bytes for v in cluster.store().versions()
                            if v not in held)
        held_snapshots = set(regional.snapshot_versions())
        cluster.start_relay("eu-west", name="relay-eu-west-restarted")
        restarted = now_ms()
        summary = cluster.wait_trainer_done(300)
        # The restarted relay may still be copying the last versions when the trainer ends: give it time to
        # converge (the invariant is that it completes the region, not that it beats the trainer).
        regional_done = cluster.wait_for(lambda: regional.versions() == cluster.store().versions(), 60,
                                         "the regional bucket complete again", required=False)
        relay = cluster.wait_for(lambda: cluster.plane.relay("eu-west"), 10, "the relay's state", required=False)
        log = cluster.plane.run_log()
        source = cluster.store()
        # Everything the restarted relay may copy: versions/snapshots the region did not hold at restart.
        allowed = sum(source.manifest(v).segment_bytes for v in source.versions() if v not in held) + sum(
            read_snapshot_manifest(source, s).total_bytes for s in source.snapshot_versions()
            if s not in held_snapshots)
        remote_results = [e for e in events(log, "settle") if e.get("actor", "").startswith("eu-west")
                          and e["accepted"] == "1" and killed <= ms(e) <= restarted]
        switches = [(e.get("actor"), e["fallback"]) for e in events(log, "source_switch")]
        result.figures = {"fallback_switches": switches, "remote_results_while_relay_down": len(remote_results),
                          "bytes_missing_at_restart": missing_bytes, "bytes_restarted_relay_may_copy": allowed,
                          "bytes_copied_by_restarted_relay": relay.bytes_copied if relay else None}
        result.invariants["remote_actors_kept_producing"] = len(remote_results) > 0
        result.invariants["restarted_relay_did_not_recopy"] = relay is not None and relay.bytes_copied <= allowed
        result.invariants["regional_bucket_complete_again"] = bool(regional_done)
        result.longest_stall_s = longest_stall(log, ["eu-west-1", "eu-west-2"], killed, ms(log[-1]))
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


def redis_restarts(run_dir: Path, quick: bool) -> ScenarioResult:
    """Redis restarts with all data lost: every component reconnects, re-derives state from the bucket, and
    the run continues."""
    steps = 10 if quick else 16
    result = ScenarioResult("redis_restarts", ["restart Redis (all streams, groups and states lost)"])
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 1, "eu-west": 2})
    with LocalCluster(spec) as cluster:
        wait_version(cluster, 3)
        log_before = cluster.plane.run_log()
        # Read before the restart: the lost log's entries are all older, the new log's all newer (read after
        # it, a busy test process may read it once the components have already logged to the new server).
        restarted = now_ms()
        cluster.redis.restart()
        summary = cluster.wait_trainer_done(300)
        log = log_before + cluster.plane.run_log()
        alive = {n: p.alive or p.process.returncode == 0 for n, p in cluster.group.processes.items()}
        result.figures = {"run_log_entries_lost_and_recovered": len(log_before),
                          "steps_after_restart": len([e for e in events(log, "step") if ms(e) >= restarted]),
                          "expired_after_restart": sum(int(e["leases"]) for e in events(log, "expire")
                                                       if ms(e) >= restarted),
                          "processes_ok": alive}
        result.invariants["every_component_survived"] = all(alive.values())
        result.longest_stall_s = longest_stall(log, cluster.actor_ids, restarted, ms(log[-1]))
        # Results settled before the restart were logged in the lost run log: count per-step only after.
        finish(result, cluster, summary, _complete_steps_only(log, restarted), expected_steps=steps)
    return result


def _complete_steps_only(log: list[dict], since_ms: int) -> list[dict]:
    """Drop settle entries of steps that straddle a run-log loss (their earlier entries are gone)."""
    straddling = {e["step"] for e in events(log, "settle") if ms(e) >= since_ms} & \
        {e["step"] for e in events(log, "settle") if ms(e) < since_ms}
    return [e for e in log if not (e.get("kind") == "settle" and e.get("step") in straddling)]


def _has_version(store: DeltaStore, version: int) -> bool:
    return version in store.versions()


def flaky_storage(run_dir: Path, quick: bool) -> ScenarioResult:
    """The home bucket is a real S3 server behind a fault-injecting proxy (5xx, slow and stalled responses),
    and one segment in the regional bucket is corrupted on disk: retries and digest checks absorb both."""
    steps = 10 if quick else 16
    result = ScenarioResult("flaky_storage", ["5% 5xx, 5% slow, 1% stalled S3 responses",
                                              "bit-flip one regional segment on disk"])
    with S3Server() as s3, environment(s3.env()):
        s3.start()
        s3.create_bucket("home")
        rates = FaultRates(error=0.05, slow=0.05, stall=0.01, slow_s=0.3, stall_s=6.0)
        with FaultProxy(s3.endpoint_url, rates, seed=7) as proxy:
            home_url = f"s3://home/run?endpoint_url={proxy.endpoint_url}"
            # The relay does not serve its hot cache here: its (good) copy would spare the actor the corrupt
            # regional one, and this scenario is about the bucket path. A corrupt cache read is rejected the
            # same way (tests/follow/test_prefetch.py).
            # A short warm start: rewards, hence gradients and non-empty deltas, from the first steps on.
            # No snapshot after the first: a thawed actor far behind could otherwise catch up through a
            # snapshot at or past the corrupted version and never read its segments (CI saw it: the corrupted
            # version was 5, a snapshot version, and nothing was refetched).
            spec = fast_spec(run_dir, steps=steps, actors={"eu-west": 1}, snapshot_every=1000,
                             env={**s3.env()}, bucket_urls={"us-east": home_url,
                                                            "eu-west": str(run_dir / "buckets" / "eu-west")},
                             relay_args=["--no-serve-cache"], trainer_args=["--warm-start-steps", "10"])
            with LocalCluster(spec) as cluster:
                wait_actor_ready(cluster, "eu-west-1")
                wait_version(cluster, 2)
                # Freeze the remote actor, the only one, so that it meets the corruption when it thaws. The home
                # actor starts now and takes the work over once the frozen actor's leases expire (it bootstraps
                # from snapshot 0 and replays every delta: it is on the trainer's version). Started any earlier,
                # it can finish a 10-step run alone (~0.3 s a step) before the freeze.
                remote = cluster.group["actor-eu-west-1"]
                os.kill(remote.process.pid, signal.SIGSTOP)
                # A version whose segments did not exist when the actor froze: the trainer's state can trail its
                # bucket by one, and the next version's segments are announced (and prefetched, cut-through)
                # before the state says so.
                target_version = max(cluster.trainer_version(), cluster.store().latest_version() or 0) + 2
                cluster.start_actor("us-east-1", "us-east")
                regional = DeltaStore(open_bucket(cluster.buckets["eu-west"]))
                # A step whose groups all earned the same reward (likely before any warm start) has no gradient
                # and publishes an empty delta: the victim is the first later version that has a segment.
                while True:
                    forwarded = functools.partial(_has_version, regional, target_version)
                    cluster.wait_for(forwarded, 90, "relay forwarding")
                    manifest = regional.manifest(target_version)
                    if manifest.segments or target_version >= steps:
                        break
                    target_version += 1
                victim = manifest.segments[0]
                path = Path(cluster.buckets["eu-west"]) / object_names.segment(victim.digest)
                blob = bytearray(path.read_bytes())
                blob[len(blob) // 2] ^= 0x40
                path.write_bytes(bytes(blob))
                os.kill(remote.process.pid, signal.SIGCONT)
                summary = cluster.wait_trainer_done(400)

                def remote_activated_target() -> bool:
                    return any(e.get("actor") == "eu-west-1" and int(e["version"]) >= target_version
                               for e in events(cluster.plane.run_log(), "activate"))

                # The thawed actor catches up version by version and may still be behind when a fast trainer
                # ends: the invariant is about how it crosses the corrupt version, not about when.
                cluster.wait_for(remote_activated_target, 60, "the corrupt version crossed", required=False)
                log = cluster.plane.run_log()
                refetched = [e for e in events(log, "refetch_source") if int(e["version"]) == target_version]
                activated = [e for e in events(log, "activate") if e.get("actor") == "eu-west-1"
                             and int(e["version"]) == target_version]
                catch_ups = [f"{e['version']}->{e['goal']}:{e['path']}" for e in events(log, "catch_up")
                             if e.get("actor") == "eu-west-1"]
                result.figures = {"proxy": proxy.counters.as_dict(), "corrupted_version": target_version,
                                  "refetched_from_source": len(refetched), "remote_catch_ups": catch_ups,
                                  "activated_digest_ok": bool(activated) and activated[0]["digest"] ==
                                  manifest.weights_digest}
                result.invariants["faults_were_injected"] = proxy.counters.errors + proxy.counters.stalls > 0
                result.invariants["corrupt_segment_refetched_not_applied"] = bool(refetched) and \
                    result.figures["activated_digest_ok"]
                result.longest_stall_s = longest_stall(log, cluster.actor_ids, ms(log[0]), ms(log[-1]))
                # The corrupted regional copy is a fault we injected on purpose: verify the home bucket only,
                # with the faults switched off (the check is of the data, not of the retries).
                proxy.rates = FaultRates()
                cluster.buckets = {"us-east": home_url}
                finish(result, cluster, summary, log, expected_steps=steps)
    return result


def trainer_restarts(run_dir: Path, quick: bool) -> ScenarioResult:
    """The trainer is SIGKILLed and restarted from its checkpoint: versions continue without gaps or
    duplicates while actors keep their current version."""
    steps = 10 if quick else 16
    result = ScenarioResult("trainer_restarts", ["SIGKILL trainer", "restart trainer from its checkpoint"])
    with LocalCluster(fast_spec(run_dir, steps=steps, actors={"us-east": 2, "eu-west": 1})) as cluster:
        wait_version(cluster, 4)
        cluster.trainer().kill()
        killed, killed_version = now_ms(), cluster.trainer_version()
        versions_before = {a: s.active_version for a, (s, _) in cluster.plane.actors().items()}
        time.sleep(2.0)
        during = {a: s.active_version for a, (s, _) in cluster.plane.actors().items()}
        cluster.start_trainer()
        summary = cluster.wait_trainer_done(300)
        log = cluster.plane.run_log()
        store = cluster.store()
        resumes = events(log, "trainer_resume")
        result.figures = {"killed_at_version": killed_version, "resumed_at": resumes[0] if resumes else None,
                          "actor_versions_at_kill": versions_before, "actor_versions_while_down": during,
                          "stale_results_after_restart": summary.get("rejected_by_reason", {}),
                          "versions": len(store.versions())}
        result.invariants["resumed_from_checkpoint"] = bool(resumes)
        result.invariants["actors_kept_their_version_while_down"] = all(
            (d := during.get(a)) is not None and d >= (v or 0) for a, v in versions_before.items())
        result.longest_stall_s = longest_stall(log, cluster.actor_ids, killed, ms(log[-1]))
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


def heterogeneous_actors(run_dir: Path, quick: bool) -> ScenarioResult:
    """One actor is 3× slower: throughput-proportional allocation (τ measured by the trainer at settlement)
    makes them finish together; the step's generation makespan is compared with a uniform split."""
    steps = 8 if quick else 14
    result = ScenarioResult("heterogeneous_actors", ["actor us-east-3 at 1/3 the throughput of the others "
                                                     "(emulated 12 vs 36 tokens/s)"])
    makespans, medians, taus = {}, {}, {}
    # Emulated speeds low enough that generation, not per-step fixed costs (activating the new version,
    # Redis, the real engine on a busy 2-core host: ~1-2 s here), dominates a step, and one generation batch
    # per actor per step (actor batch ≥ the step's batch, like continuous batching): a share then costs time
    # in proportion to its tokens, which is what proportional allocation equalises. The trainer measures τ
    # as tokens over the whole hold window, fixed costs included, so they must not swamp generation.
    for split in ("uniform", "proportional"):
        spec = fast_spec(run_dir / split, steps=steps, batch_size=24, group_size=4, actors={"us-east": 2},
                         actor_args=["--sim-tokens-per-s", "36", "--batch-size", "24"],
                         trainer_args=["--split", split, "--initial-lease-s", "40"])
        with LocalCluster(spec) as cluster:
            cluster.start_actor("us-east-3", "us-east", ["--sim-tokens-per-s", "12"])
            summary = cluster.wait_trainer_done(400)
            log = cluster.plane.run_log()
            # skip the first steps: actors join at different times and estimates settle
            spans = [t["makespan_s"] for t in summary["step_times"][2:]]
            makespans[split] = statistics.mean(spans) if spans else None
            # the median too: one step stalled by a neighbour on a shared host skews a mean of six
            medians[split] = statistics.median(spans) if spans else None
            measured = {e["actor"] for e in events(log, "measure")}
            taus[split] = {a: [float(e["estimate"]) for e in events(log, "measure") if e["actor"] == a]
                           for a in sorted(measured)}
            if split == "proportional":
                finish(result, cluster, summary, log, expected_steps=steps)
                last = [json.loads(e["estimates"]) for e in events(log, "dispatch")][-1]
                shares = [json.loads(e["shares"]) for e in events(log, "dispatch")][-1]
                result.figures["tau_final"] = {a: round(v, 1) for a, v in last.items()}
                result.figures["shares_final"] = shares
                result.invariants["tau_measured_for_every_actor"] = measured >= set(cluster.actor_ids)
    uniform, proportional = makespans["uniform"], makespans["proportional"]
    gain = (uniform / proportional - 1) if uniform and proportional else None
    med_u, med_p = medians["uniform"], medians["proportional"]
    med_gain = (med_u / med_p - 1) if med_u and med_p else None
    result.figures.update({"mean_makespan_uniform_s": uniform, "mean_makespan_proportional_s": proportional,
                           "proportional_speedup_pct": round(100 * gain, 1) if gain is not None else None,
                           "median_makespan_uniform_s": med_u, "median_makespan_proportional_s": med_p,
                           "proportional_speedup_median_pct": round(100 * med_gain, 1) if med_gain is not None
                           else None,
                           "paper_pct": "26-35", "tau_source": "measured at settlement",
                           "tau_trajectory_slow_actor": [round(t, 1) for t in
                                                         taus.get("proportional", {}).get("us-east-3", [])]})
    result.invariants["proportional_at_least_25pct_faster"] = med_gain is not None and med_gain >= 0.25
    return result


def hostile_actor(run_dir: Path, quick: bool) -> ScenarioResult:
    """One admitted actor of the fleet is hostile (:class:`~workers.chaos.hostile.HostileActor`): it answers its
    own leases with results its lease could not have produced, answers and hands back the honest actors'
    leases as if it were them, and claims 10⁹ tokens/s. The run completes, no forged rollout is accepted,
    and every honest actor stays on the trainer's digest."""
    steps = 8 if quick else 14
    result = ScenarioResult("hostile_actor", ["an admitted actor forges results, impersonates and hands back"])
    with LocalCluster(fast_spec(run_dir, steps=steps, actors={"us-east": 2})) as cluster:
        wait_actor_ready(cluster, "us-east-1")
        hostile = HostileActor(cluster, "hostile", "us-east", ["us-east-1", "us-east-2"])
        hostile.start()
        try:
            summary = cluster.wait_trainer_done(400)
        finally:
            hostile.leave()
        log = cluster.plane.run_log()
        settled = events(log, "settle")
        reasons = Counter(e.get("reason", "") for e in settled if e.get("accepted") == "0")
        result.figures = {"sent": dict(hostile.sent), "refused": dict(reasons),
                          "hostile_shares": [json.loads(e["shares"]).get("hostile", 0)
                                             for e in events(log, "dispatch")]}
        result.invariants["hostile_actor_ran"] = hostile.error is None and hostile.sent["impersonated"] > 0
        result.invariants["no_forged_rollout_accepted"] = not [
            e for e in settled if e.get("accepted") == "1" and e.get("actor") == "hostile"]
        result.invariants["forgeries_refused_by_signature_and_shape"] = (reasons["bad_signature"] > 0
                                                                         and reasons["bad_shape"] > 0)
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


def hostile_notifier(run_dir: Path, quick: bool) -> ScenarioResult:
    """A relay's Redis credentials in hostile hands (:class:`~workers.chaos.notifier.HostileNotifier`) flood the
    home and the remote region's event streams with malformed events, commits and staged events for versions
    no bucket holds, segment names that do not exist and real segments re-announced for versions that never
    come. The run completes, the relay forwards every real version and no other, and every honest actor —
    home and remote — stays on the trainer's digest."""
    steps = 8 if quick else 14
    result = ScenarioResult("hostile_notifier", ["forged version events on every region's stream"])
    spec = fast_spec(run_dir, steps=steps, actors={"us-east": 1, "eu-west": 1})
    with LocalCluster(spec) as cluster:
        wait_actor_ready(cluster, "eu-west-1")
        notifier = HostileNotifier(cluster.redis.url_for("relay"), spec.run, ["us-east", "eu-west"], cluster.store())
        notifier.start()
        try:
            summary = cluster.wait_trainer_done(400)
        finally:
            notifier.leave()
        regional, source = cluster.store("eu-west"), cluster.store()
        complete = cluster.wait_for(lambda: regional.versions() == source.versions(), 60,
                                    "the regional bucket complete", required=False)
        log = cluster.plane.run_log()
        result.figures = {"sent": dict(notifier.sent), "source_versions": source.versions(),
                          "regional_versions": regional.versions(),
                          "regional_snapshots": regional.snapshot_versions()}
        result.invariants["hostile_notifier_ran"] = notifier.error is None and notifier.sent["commit_far_ahead"] > 0
        result.invariants["relay_forwarded_every_real_version_and_no_other"] = bool(complete) and \
            set(regional.versions()) == set(source.versions())
        finish(result, cluster, summary, log, expected_steps=steps)
    return result


SCENARIOS: dict[str, Scenario] = {
    "kill_actor_mid_batch": kill_actor_mid_batch,
    "sigterm_graceful_leave": sigterm_actor,
    "actor_joins_mid_run": actor_joins_mid_run,
    "actor_falls_behind": actor_falls_behind,
    "gc_during_lag": gc_during_lag,
    "relay_dies": relay_dies,
    "redis_restarts": redis_restarts,
    "flaky_storage": flaky_storage,
    "trainer_restarts": trainer_restarts,
    "heterogeneous_actors": heterogeneous_actors,
    "hostile_actor": hostile_actor,
    "hostile_notifier": hostile_notifier,
}
