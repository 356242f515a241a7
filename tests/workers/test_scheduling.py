"""Scheduling from measured work, with a real trainer, real actors and a real Redis.

Four actors: two honest ones emulating 100 tokens/s, a *liar* whose generation is capped at 20 tokens/s
while its heartbeat claims 10⁶ tokens/s (a slow-but-boastful actor), and one that is throttled to
10 tokens/s mid-run without its self-report noticing. The throttle (``--throttle-file``) stretches batches
after the actor's own measurement, so only the trainer's settlement-time measurement can see it.
"""

from __future__ import annotations

import json
import math
import statistics
import time

import pytest

from workers.cluster import ClusterSpec, LocalCluster

BATCH, STEPS, SLOW_AT = 24, 10, 4

# Shares follow throughput the trainer measures (20 vs 100 tokens/s emulated): timed tests, run one at a time at
# normal priority by `make test` (scripts/run-tests). Mostly waiting (~6 of its ~50 s on a CPU), it costs the
# timed tests' worker little and takes a long wait off the others.
pytestmark = pytest.mark.serial


def ms(entry: dict[str, str]) -> int:
    return int(entry["id"].split("-")[0])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sched")
    liar_cap, slowed_cap = root / "liar.cap", root / "slowed.cap"
    liar_cap.write_text("20")
    spec = ClusterSpec(run_dir=root, steps=STEPS, batch_size=BATCH, group_size=4, actors={"us-east": 0},
                       snapshot_every=5,
                       # Leases long enough that the throttled actors finish theirs: every settlement is an
                       # accepted result, so the shares below come from measured rates, not from expiries.
                       trainer_args=["--warm-start-steps", "0", "--epochs", "1", "--initial-lease-s", "40",
                                     "--lease-factor", "12"])
    with LocalCluster(spec) as cluster:
        for name in ("honest-1", "honest-2"):
            cluster.start_actor(name, "us-east", ["--sim-tokens-per-s", "100"])
        cluster.start_actor("liar", "us-east", ["--throttle-file", str(liar_cap), "--claim-tokens-per-s", "1e6"])
        cluster.start_actor("slowed", "us-east", ["--sim-tokens-per-s", "100", "--throttle-file", str(slowed_cap)])
        cluster.wait_for(lambda: cluster.trainer_version() >= SLOW_AT, 300, f"version {SLOW_AT}")
        slowed_cap.write_text("10")
        throttled_ms = int(time.time() * 1000)
        cluster.plane.log_event("throttle", actor="slowed", tokens_per_s=10)  # marks it in the exported run log
        summary = cluster.wait_trainer_done(400)
        log = cluster.plane.run_log()
        reports = {a: s.tokens_per_s for a, (s, _) in cluster.plane.actors().items()}
        yield {"summary": summary, "log": log, "throttled_ms": throttled_ms, "reports": reports}


def dispatches(log):
    return [(ms(e), json.loads(e["shares"]), json.loads(e["estimates"])) for e in log if e["kind"] == "dispatch"]


def measures(log, actor):
    return [e for e in log if e["kind"] == "measure" and e["actor"] == actor]


def test_a_lying_actor_gets_no_more_than_its_measured_share_from_its_second_step_on(run):
    log = run["log"]
    assert run["reports"]["liar"] == 1e6, run["reports"]  # it does claim to be the fastest by far
    # dispatches that split the batch between the liar and an honest actor (when everyone else is lagging,
    # the only eligible actor rightly gets the whole batch)
    split = [(t, s, est) for t, s, est in dispatches(log)
             if s.get("liar") and (s.get("honest-1") or s.get("honest-2"))]
    measured = measures(log, "liar")
    assert measured, "the liar's work was measured"
    rates = [(ms(e), float(e["tokens_per_s"])) for e in measured]
    assert statistics.median(r for _, r in rates) < 30, rates  # its real (throttled) speed, whatever it says
    later = [(t, s, est) for t, s, est in split if t > rates[0][0]]
    assert len(later) >= 3, split
    for t, share, est in later:
        fastest_measured = max(r for m, r in rates if m < t)
        assert est["liar"] <= fastest_measured + 0.1, (est, rates)  # never above what was measured
        others = sum(v for a, v in est.items() if a != "liar")
        measured_share = BATCH * fastest_measured / (others + fastest_measured)
        assert share["liar"] <= max(1, math.ceil(measured_share)), (share, est, fastest_measured)
    # Against its true speed (1/5 of an honest actor's), over the run: at most twice that, plus rounding.
    ratio = statistics.median(s["liar"] / max(statistics.median(s.get(a, 0) for a in ("honest-1", "honest-2")), 1)
                              for _, s, _ in later)
    assert ratio <= 0.4, later


def test_an_actor_slowed_mid_run_loses_share_within_two_settlements(run):
    log, throttled = run["log"], run["throttled_ms"]
    before = [s["slowed"] for t, s, _ in dispatches(log) if t < throttled and s.get("slowed")][-3:]
    assert before, "the actor had work before it was throttled"
    # settlements whose whole hold window lies after the throttle
    after = [e for e in measures(log, "slowed") if ms(e) - 1000 * float(e["seconds"]) >= throttled]
    assert len(after) >= 2, after
    assert float(after[0]["tokens_per_s"]) < 15
    second = ms(after[1])
    following = [s.get("slowed", 0) for t, s, _ in dispatches(log) if t > second]
    assert following, "a dispatch followed its second throttled settlement"
    assert following[0] <= 0.6 * statistics.median(before), (before, following)
    # and its self-report never noticed: only the trainer's measurement did
    assert run["reports"]["slowed"] > 50, run["reports"]


def test_the_run_completes_with_every_prompt_accepted_once(run):
    summary = run["summary"]
    assert summary["steps"] == STEPS and summary["rollouts_accepted"] == STEPS * BATCH
