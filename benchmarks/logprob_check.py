"""The trainer's logprob check on honest and forged rollouts: ``python -m benchmarks logprob_check --json``.

Honest results come from the real torch actor engine (:class:`workers.engines.torch_engine.TorchEngine`: bf16
weights, HF ``generate`` with a KV cache, the log-probabilities it reports); the trainer side is
:class:`workers.trainer.rollout_check.RolloutCheck` holding the same version's bf16 weights. The statistic is
each sample's mean |claimed − recomputed|; the output gives its distribution on honest samples, the
false-rejection rate (per sample and per result, i.e. per group) at the tolerance, and the rejection rate of
four forgeries:

- ``other_version_near`` / ``other_version_far``: tokens and logprobs honestly sampled from other weights of the
  same run (one optimizer step at the trainer's default learning rate / a few dozen supervised steps away),
  claimed as the leased version;
- ``random_tokens``: random tokens claimed with log-probability −0.01 each;
- ``copied_logprobs``: an honest sample's log-probabilities on other (random) tokens of the same length.

``--model-config`` (JSON) overrides the built-in small Qwen3 (e.g. a wider vocabulary), ``--warm-start-steps``
the supervised steps it gets first (a peaked policy, as in a real run).

``--bucket URL [--version V]`` measures on a run's own weights instead: version ``V`` (default: the newest) is
rebuilt from the run's bucket the way an actor follows it (its snapshot's files, then deltas, each checked
against its manifest's digest), and the other-version forgeries are the run's own neighbours, ``V − 1`` and
``V + 1`` (where the bucket holds them). This is how to set ``--logprob-tolerance`` for a real run, or to tell
whether a take-back was noise: the honest statistic on the very weights it happened on. The prompts are the
addition task's (``--max-operand``: the trainer's).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import ModelLayout
from aurora_store.errors import ConfigError, VersionNotFoundError
from aurora_store.follow import BucketChain, Follower
from aurora_store.store import DeltaStore, open_bucket
from benchmarks.wan_bench.warm import build
from workers.engines.torch_engine import TorchEngine
from workers.rl.model import DEFAULT_CONFIG, load_model, load_tokenizer, warm_start
from workers.rl.task import AdditionTask
from workers.trainer.rollout_check import DEFAULT_TOLERANCE, RolloutCheck, ScoredSample


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--results", type=int, default=400, help="honest results (groups) to score")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts-per-call", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--max-operand", type=int, default=99, help="addition task operands (longer answers)")
    parser.add_argument("--warm-start-steps", type=int, default=60)
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--model-config", help="JSON overriding fields of the built-in small Qwen3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=["torch", "vllm"], default="torch",
                        help="the honest actor's engine (vllm: the CPU build; the other-version forgeries need "
                             "torch's in-process weights and are skipped)")
    parser.add_argument("--bucket", help="measure on this run's own weights (its bucket's URL) instead of a "
                                         "built model (torch engine)")
    parser.add_argument("--version", type=int, help="with --bucket: the version to measure on (default: newest)")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.bucket is not None:
        if args.engine != "torch" or args.model_config:
            raise ConfigError("--bucket measures with the torch engine on the run's own model: drop --engine "
                              "and --model-config")
        return run_on_bucket(args.bucket, args.version, results=args.results, group_size=args.group_size,
                             per_call=args.prompts_per_call, max_operand=args.max_operand,
                             tolerance=args.tolerance, temperature=args.temperature, seed=args.seed)
    if args.version is not None:
        raise ConfigError("--version needs --bucket")
    overrides = json.loads(args.model_config) if args.model_config else {}
    return run(overrides, results=args.results, group_size=args.group_size, per_call=args.prompts_per_call,
               max_operand=args.max_operand, warm_steps=args.warm_start_steps, tolerance=args.tolerance,
               temperature=args.temperature, seed=args.seed, engine_kind=args.engine)


def run(overrides: dict[str, Any], *, results: int, group_size: int, per_call: int, max_operand: int,
        warm_steps: int, tolerance: float, temperature: float, seed: int, engine_kind: str = "torch"
        ) -> dict[str, Any]:
    config = {**DEFAULT_CONFIG, **overrides}
    task = AdditionTask(max_operand=max_operand, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build(overrides, warm_steps, Path(tmp) / "v0", seed=seed, max_operand=max_operand)
        layout = ModelLayout.from_config(config)
        trainer_model = load_model(model_dir)  # fp32 master weights, as the trainer holds them
        check = RolloutCheck(trainer_model, vocab_size=config["vocab_size"], tolerance=tolerance)
        check.hold({n: p.to(torch.bfloat16) for n, p in trainer_model.named_parameters()}, 0)
        engine: Any
        if engine_kind == "vllm":
            from workers.vllm.engine import VllmEngine

            engine = VllmEngine(model_dir, layout, seed=seed, max_model_len=int(config["max_position_embeddings"]))
        else:
            engine = TorchEngine(model_dir, layout, seed=seed)
        t0 = time.perf_counter()
        tokenizer = load_tokenizer(model_dir)
        honest = _generate(engine, tokenizer, task, results, group_size, per_call, max_operand, temperature, seed)
        generate_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        honest_scores = _scores(check, honest, temperature)
        score_s = time.perf_counter() - t0
        out: dict[str, Any] = {
            "benchmark": "logprob_check", "engine": engine_kind,
            "model": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
            "warm_start_steps": warm_steps, "temperature": temperature, "tolerance": tolerance,
            "statistic": "per-sample mean |claimed - recomputed| over completion tokens; a result is rejected if "
                         "any of its samples exceeds the tolerance",
            "honest": _honest(honest, honest_scores, group_size, tolerance),
            "seconds": {"generate": round(generate_s, 2), "check": round(score_s, 3),
                        "check_per_1k_samples": round(1000 * score_s / max(len(honest), 1), 3)},
        }
        rng = random.Random(seed + 1)
        forged: dict[str, Any] = {}
        others = (("other_version_near", 2e-4, 1), ("other_version_far", 3e-3, 40)) if engine_kind == "torch" else ()
        for name, lr, steps in others:
            other = load_model(model_dir)
            warm_start(other, tokenizer, task, steps, lr=lr, batch=32, seed=seed + 7)
            with torch.no_grad():
                for n, p in engine.model.named_parameters():
                    p.copy_(dict(other.named_parameters())[n].to(torch.bfloat16))
            count = max(results // 4, 1)
            samples = _generate(engine, tokenizer, task, count, group_size, per_call, max_operand, temperature,
                                seed + 11)
            forged[name] = _forged(_scores(check, samples, temperature), group_size, tolerance)
        honest_flat = [s for s in honest]
        random_tokens = [ScoredSample(s.prompt_ids, tuple(rng.randrange(3, 18) for _ in s.completion_ids),
                                      tuple(-0.01 for _ in s.completion_ids)) for s in honest_flat]
        forged["random_tokens"] = _forged(_scores(check, random_tokens, temperature), group_size, tolerance)
        copied = [ScoredSample(s.prompt_ids, tuple(rng.randrange(3, 18) for _ in s.completion_ids), s.claimed)
                  for s in honest_flat]
        forged["copied_logprobs"] = _forged(_scores(check, copied, temperature), group_size, tolerance)
        out["forged"] = forged
        engine.close()
        return out


def run_on_bucket(url: str, version: int | None, *, results: int, group_size: int, per_call: int,
                  max_operand: int, tolerance: float, temperature: float, seed: int) -> dict[str, Any]:
    """The check on a run's own weights: honest samples of ``version`` and samples of its neighbours.

    One engine follows the run forwards as an actor does (:meth:`Follower.bootstrap` to ``version − 1``: a
    snapshot's files are the engine's model directory), generating the "previous" samples there, the honest
    ones at ``version`` (held by the check) and the "next" ones at ``version + 1`` when the bucket has it. A
    version the bucket cannot rebuild is a :class:`~aurora_store.errors.VersionNotFoundError` before anything
    is generated."""
    store = DeltaStore(open_bucket(url))
    deltas = set(store.versions())
    held = sorted(deltas | set(store.snapshot_versions()))
    if not held:
        raise VersionNotFoundError(f"{url} holds no version of a run (no deltas, no snapshots)")
    goal = held[-1] if version is None else version
    if goal not in held:
        raise VersionNotFoundError(f"{url} holds no version {goal} (it holds {held[0]}..{held[-1]})")
    task = AdditionTask(max_operand=max_operand, seed=seed)
    follower = Follower(BucketChain(store))
    with tempfile.TemporaryDirectory() as tmp:
        boot = follower.bootstrap(store, max(goal - 1, 0), Path(tmp))
        engine = TorchEngine(boot.model_dir, boot.layout, seed=seed)
        follower.attach(engine.target, boot)
        tokenizer = load_tokenizer(boot.model_dir)
        config = json.loads((boot.model_dir / "config.json").read_text())
        check = RolloutCheck(load_model(boot.model_dir), vocab_size=int(config["vocab_size"]), tolerance=tolerance)
        count = max(results // 4, 1)

        def sample(n: int, salt: int) -> list[ScoredSample]:
            return _generate(engine, tokenizer, task, n, group_size, per_call, max_operand, temperature, seed + salt)

        # Generated before the check can hold ``goal``: deltas only go forwards.
        previous = sample(count, 11) if engine.target.version == goal - 1 else []
        follower.follow_to(goal, snapshots=False)
        digest = str(engine.target.full_digest())  # what the engine holds, hashed from scratch
        check.hold({n: p.detach() for n, p in engine.model.named_parameters()}, goal)
        honest = sample(results, 0)
        forged: dict[str, Any] = {}
        if previous:
            forged["previous_version"] = _forged(_scores(check, previous, temperature), group_size, tolerance)
        if goal + 1 in deltas:
            follower.follow_to(goal + 1, snapshots=False)
            forged["next_version"] = _forged(_scores(check, sample(count, 13), temperature), group_size, tolerance)
        engine.close()
    return {"benchmark": "logprob_check", "engine": "torch",
            "source": {"bucket": url, "version": goal, "weights_digest": digest, "snapshot": boot.plan.snapshot},
            "model": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
            "temperature": temperature, "tolerance": tolerance,
            "honest": _honest(honest, _scores(check, honest, temperature), group_size, tolerance), "forged": forged}


def _generate(engine: Any, tokenizer: Any, task: AdditionTask, results: int, group_size: int, per_call: int,
              max_operand: int, temperature: float, seed: int) -> list[ScoredSample]:
    out: list[ScoredSample] = []
    call = 0
    while len(out) < results * group_size:
        prompts = task.prompts(seed * 1000 + call, per_call)
        groups = engine.generate([p.text for p in prompts], group_size, len(str(2 * max_operand)) + 1,
                                 temperature, seed + call)
        for prompt, group in zip(prompts, groups, strict=True):
            prompt_ids = tuple(tokenizer(prompt.text).input_ids)
            out += [ScoredSample(prompt_ids, c.ids, tuple(round(x, 6) for x in c.logprobs)) for c in group]
        call += 1
    return out[: results * group_size]


def _scores(check: RolloutCheck, samples: list[ScoredSample], temperature: float) -> list[float]:
    return [s.statistic for s in check.score(samples, temperature)]


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    return {"mean": statistics.fmean(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "p999": at(0.999), "max": ordered[-1]}


def _group_rejections(scores: list[float], group_size: int, tolerance: float) -> tuple[int, int]:
    groups = [scores[i:i + group_size] for i in range(0, len(scores), group_size)]
    return sum(1 for g in groups if max(g) > tolerance), len(groups)


#: Tolerances the output also reports rates at (the choice of ``DEFAULT_TOLERANCE`` is a trade-off between them).
SWEEP = (0.02, 0.03, 0.05, 0.08, 0.1, 0.2)


def _sweep(scores: list[float], group_size: int) -> dict[str, float]:
    out = {}
    for tolerance in SWEEP:
        rejected, groups = _group_rejections(scores, group_size, tolerance)
        out[str(tolerance)] = round(rejected / groups, 6)
    return out


def _honest(samples: list[ScoredSample], scores: list[float], group_size: int, tolerance: float) -> dict[str, Any]:
    rejected, groups = _group_rejections(scores, group_size, tolerance)
    tokens = sum(len(s.completion_ids) for s in samples)
    return {"samples": len(scores), "results": groups, "tokens": tokens,
            "false_rejection_rate_results_at": _sweep(scores, group_size),
            "statistic": {k: round(v, 6) for k, v in _percentiles(scores).items()},
            "false_rejections_samples": sum(1 for s in scores if s > tolerance),
            "false_rejection_rate_samples": sum(1 for s in scores if s > tolerance) / len(scores),
            "false_rejections_results": rejected, "false_rejection_rate_results": rejected / groups}


def _forged(scores: list[float], group_size: int, tolerance: float) -> dict[str, Any]:
    rejected, groups = _group_rejections(scores, group_size, tolerance)
    return {"samples": len(scores), "results": groups,
            "rejection_rate_results_at": _sweep(scores, group_size),
            "statistic": {k: round(v, 6) for k, v in _percentiles(scores).items()},
            "rejection_rate_samples": sum(1 for s in scores if s > tolerance) / len(scores),
            "rejection_rate_results": rejected / groups}
