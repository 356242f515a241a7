"""Forged rollouts against the trainer's logprob check.

The real-process test runs a real trainer, Redis and bucket with one honest actor and two hostile ones (real
actor processes, registered like any other, whose engine returns forged rollouts: random tokens claimed at
high probability, and honest log-probabilities copied onto other tokens). The run must complete, every forged
result must be taken back before its step trains on it, and no honest result may be.

The check itself is also driven with the real torch actor engine: honest samples pass, samples from other
weights of the run, random tokens and copied log-probabilities do not, and samples that cannot be scored are
rejected instead of raising.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from aurora_store.bus.messages import RolloutResult
from aurora_store.codec import ModelLayout
from aurora_store.sched import LeasePolicy, Prompt, StepLedger
from workers.cluster import ClusterSpec, LocalCluster
from workers.engines.torch_engine import TorchEngine
from workers.rl.model import DEFAULT_CONFIG, build_model, load_model, warm_start
from workers.rl.task import AdditionTask, build_tokenizer
from workers.trainer.rollout_check import DEFAULT_TOLERANCE, RolloutCheck, ScoredSample

STEPS = 5


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("forged"), steps=STEPS, batch_size=6, group_size=4,
                       home="home", actors={"home": 1}, snapshot_every=100,
                       trainer_args=["--warm-start-steps", "20", "--epochs", "1", "--split", "uniform",
                                     "--initial-lease-s", "30", "--min-actors", "3"])
    with LocalCluster(spec) as cluster:
        # The first step waits for all three (--min-actors): started after the honest one by a test process
        # that may be slow to get the CPU, the hostile actors once missed every step of the run. Uniform
        # shares give each of them a third of every step it is eligible for.
        cluster.start_actor("hostile-random", "home", ["--forge-rollouts", "random_tokens"])
        cluster.start_actor("hostile-copied", "home", ["--forge-rollouts", "copied_logprobs"])
        summary = cluster.wait_trainer_done(timeout=600)
        final = summary["trainer_version"]
        cluster.wait_for(lambda: cluster.plane.actors().get("home-1", (None,))[0] is not None and
                         cluster.plane.actors()["home-1"][0].active_version == final, 120, "the honest actor")
        yield {"summary": summary, "log": cluster.plane.run_log()}


@pytest.mark.slow
@pytest.mark.redis
def test_a_forged_rollout_is_never_trained_on_and_the_run_completes(hostile_run):
    assert hostile_run["summary"]["trainer_version"] == STEPS
    log = hostile_run["log"]
    accepted = Counter((e["actor"], e["step"], e["prompt"]) for e in log
                       if e["kind"] == "settle" and str(e["accepted"]) == "1")
    taken_back = Counter((e["actor"], e["step"], e["prompt"]) for e in log if e["kind"] == "take_back")
    hostile = {k: n for k, n in accepted.items() if k[0].startswith("hostile")}
    assert hostile, "the hostile actors never got a lease: the test proves nothing"
    # Every forged result accepted by the ledger was taken back by the logprob check before training ...
    assert taken_back == Counter(hostile)
    # ... and no honest one was (no false rejection in this run).
    assert not [k for k in taken_back if k[0] == "home-1"]
    assert {e["reason"] for e in log if e["kind"] == "take_back"} == {"logprobs"}
    # Each take-back names its worst sample's furthest tokens: claims far from what the weights give.
    for event in (e for e in log if e["kind"] == "take_back"):
        evidence = json.loads(event["evidence"])
        assert 1 <= len(evidence) <= min(int(event["length"]), 8), event
        gaps = [abs(claimed - recomputed) for _, _, claimed, recomputed in evidence]
        assert gaps == sorted(gaps, reverse=True) and gaps[0] >= float(event["statistic"]), event
        assert all(0 <= position < int(event["length"]) for position, *_ in evidence), event
    # every step trained on a full batch: the honest actor redid the forged prompts
    steps = [e for e in log if e["kind"] == "step"]
    assert len(steps) == STEPS


# --- the check against the real torch engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_and_check(tmp_path_factory):
    task = AdditionTask(max_operand=99, seed=0)
    model = build_model(DEFAULT_CONFIG, seed=0)
    tokenizer = build_tokenizer()
    warm_start(model, tokenizer, task, 40, seed=0)
    model_dir = Path(tmp_path_factory.mktemp("model"))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    engine = TorchEngine(model_dir, ModelLayout.from_config(DEFAULT_CONFIG), seed=0)
    check = RolloutCheck(model, vocab_size=DEFAULT_CONFIG["vocab_size"])
    check.hold({n: p.to(torch.bfloat16) for n, p in model.named_parameters()}, 7)
    return {"engine": engine, "check": check, "task": task, "dir": model_dir, "tokenizer": tokenizer}


def _sample(ctx, engine: TorchEngine, results: int, seed: int) -> dict[str, list[ScoredSample]]:
    prompts = ctx["task"].prompts(seed, results)
    groups = engine.generate([p.text for p in prompts], 4, 4, 1.0, seed)
    return {p.prompt_id: [ScoredSample(tuple(ctx["tokenizer"](p.text).input_ids), c.ids,
                                       tuple(round(x, 6) for x in c.logprobs)) for c in group]
            for p, group in zip(prompts, groups, strict=True)}


def test_honest_rollouts_of_the_held_version_pass(engine_and_check):
    groups = _sample(engine_and_check, engine_and_check["engine"], 32, 1)
    verdicts = engine_and_check["check"].judge(groups)
    assert len(verdicts) == 32 and all(v.accepted for v in verdicts), [v for v in verdicts if not v.accepted]
    assert max(v.worst for v in verdicts) < DEFAULT_TOLERANCE / 2


def test_rollouts_sampled_from_other_weights_of_the_run_are_rejected(engine_and_check):
    other = load_model(engine_and_check["dir"])
    warm_start(other, engine_and_check["tokenizer"], engine_and_check["task"], 40, seed=5)
    engine = TorchEngine(engine_and_check["dir"], ModelLayout.from_config(DEFAULT_CONFIG), seed=0)
    with torch.no_grad():
        theirs = dict(other.named_parameters())
        for name, param in engine.model.named_parameters():
            param.copy_(theirs[name].to(torch.bfloat16))
    verdicts = engine_and_check["check"].judge(_sample(engine_and_check, engine, 32, 2))
    assert all(not v.accepted and v.reason == "logprobs" for v in verdicts)


def test_random_tokens_and_copied_logprobs_are_rejected(engine_and_check):
    groups = _sample(engine_and_check, engine_and_check["engine"], 16, 3)
    random_tokens = {p: [ScoredSample(s.prompt_ids, tuple(3 + (t + 5) % 15 for t in s.completion_ids),
                                      tuple(-0.01 for _ in s.claimed)) for s in g] for p, g in groups.items()}
    copied = {p: [ScoredSample(s.prompt_ids, tuple(3 + (t + 7) % 15 for t in s.completion_ids), s.claimed)
                  for s in g] for p, g in groups.items()}
    for forged in (random_tokens, copied):
        assert not any(v.accepted for v in engine_and_check["check"].judge(forged))


def test_a_rejected_sample_names_its_furthest_tokens_and_an_accepted_one_nothing(engine_and_check):
    check = engine_and_check["check"]
    honest = _sample(engine_and_check, engine_and_check["engine"], 8, 6)
    assert all(v.accepted and v.evidence == () for v in check.judge(honest))
    # Eight completions of 1..12 tokens claimed at -0.01 each: far from what the weights give.
    prompt_ids = next(iter(honest.values()))[0].prompt_ids
    samples = [ScoredSample(prompt_ids, tuple(3 + (k + j) % 15 for j in range(n)), (-0.01,) * n)
               for k, n in enumerate((1, 2, 3, 5, 8, 9, 12, 4))]
    for sample in samples:
        verdict = check.judge({"p": [sample]})[0]
        (recomputed,) = check.recompute([sample])
        gaps = (torch.tensor(sample.claimed) - recomputed).abs()
        assert not verdict.accepted and verdict.reason == "logprobs" and verdict.length == len(sample.claimed)
        assert len(verdict.evidence) == min(len(sample.claimed), 8)
        assert [e.position for e in verdict.evidence] == torch.argsort(gaps, descending=True, stable=True)[:8].tolist()
        for e in verdict.evidence:
            assert e.token == sample.completion_ids[e.position] and e.claimed == sample.claimed[e.position]
            assert e.recomputed == pytest.approx(float(recomputed[e.position]), abs=0)
    # A group's verdict carries its worst sample's evidence; one that cannot be scored carries none.
    group = check.judge({"g": [next(iter(honest.values()))[0], samples[6]]})[0]
    assert group.length == 12 and group.worst == pytest.approx(
        float((torch.tensor(samples[6].claimed) - check.recompute([samples[6]])[0]).abs().mean()))
    unscorable = check.judge({"u": [ScoredSample(prompt_ids, (10**9,), (-0.1,))]})[0]
    assert unscorable.reason == "unscorable" and unscorable.evidence == () and unscorable.length == 0


def test_samples_that_cannot_be_scored_are_rejected_not_raised(engine_and_check):
    good = next(iter(_sample(engine_and_check, engine_and_check["engine"], 1, 4).values()))[0]
    check = engine_and_check["check"]
    bad = {
        "out_of_vocab": [ScoredSample(good.prompt_ids, (10**9,), (-0.1,))],
        "negative_id": [ScoredSample(good.prompt_ids, (-1,), (-0.1,))],
        "length_mismatch": [ScoredSample(good.prompt_ids, good.completion_ids, good.claimed[:-1] or (1.0, 2.0))],
        "nan": [ScoredSample(good.prompt_ids, good.completion_ids, (math.nan,) * len(good.claimed))],
        "empty": [ScoredSample(good.prompt_ids, (), ())],
        "no_samples": [],
        "mixed": [good, ScoredSample(good.prompt_ids, (10**9,), (-0.1,))],
    }
    verdicts = {v.prompt_id: v for v in check.judge(bad)}
    assert all(not v.accepted and v.reason == "unscorable" for v in verdicts.values()), verdicts
    assert check.judge({"good": [good]})[0].accepted


# --- the ledger's take-back ---------------------------------------------------------------------------


def test_a_taken_back_result_leaves_the_step_and_its_prompt_is_leased_again():
    ledger = StepLedger(1, 3, "d", [Prompt("a", "1+1="), Prompt("b", "2+2=")], LeasePolicy(), group_size=1)
    leases = ledger.grant("x", 2, 0)
    for lease in leases:
        result = RolloutResult("result", lease.lease_id, "x", "", version=3, weights_digest="d",
                               samples=[{"ids": [3], "logprobs": [-0.1], "text": "2"}])
        assert ledger.settle(result, 10).accepted
    assert ledger.complete
    verdict = ledger.reject("a", "logprobs")
    assert not verdict.accepted and verdict.lease is not None and verdict.lease.actor_id == "x"
    assert not ledger.complete and list(ledger.pool) == ["a"] and ledger.rejected["logprobs"] == 1
    assert ledger.reject("a", "logprobs").lease is None  # nothing accepted for it any more
    assert list(ledger.pool) == ["a"]
    ledger.check_invariants()
    # dropped instead of leased again: the step is complete without it
    ledger.reject("b", "logprobs")
    assert ledger.drop("b") and not ledger.drop("b")
    assert "b" not in ledger.prompts and list(ledger.pool) == ["a"]
    ledger.check_invariants()
    assert ledger.drop("a") and ledger.complete


# --- the benchmark's options ------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--version", "3"], "--version needs --bucket"),
    (["--bucket", "{empty}", "--engine", "vllm"], "--bucket measures with the torch engine"),
    (["--bucket", "{empty}"], "holds no version of a run"),
])
def test_the_benchmark_refuses_what_it_cannot_measure_in_one_line(tmp_path, args, message):
    empty = tmp_path / "bucket"
    empty.mkdir()
    argv = [a.replace("{empty}", f"file://{empty}") for a in args]
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "logprob_check", *argv], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and list(empty.iterdir()) == []
