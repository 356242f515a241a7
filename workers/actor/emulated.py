"""An actor on an emulated engine, for scheduling tests, chaos scenarios and benchmarks:
``python -m workers.actor.emulated [emulation flags] <actor flags>``.

The engine still generates for real (so rollouts, digests and leases are real); :class:`EmulatedEngine` only
stretches each batch to emulate a slower accelerator, and can be throttled from a file mid-run without the
actor's self-measurement noticing (:class:`EmulatedThroughput`), or make the actor report a rate it does not
have, or return forged rollouts (``--forge-rollouts``: a hostile actor for the trainer's logprob check). The
production actor (``python -m workers.actor``) knows nothing of this.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

from workers.actor.throughput import Throughput
from workers.engines import Completion, Engine

#: Flags of this entry point (anything else goes to the actor's own command line).
FLAGS = ("--slowdown", "--sim-tokens-per-s", "--sim-full-length", "--throttle-file", "--claim-tokens-per-s",
         "--forge-rollouts")

#: How a hostile actor forges its rollouts (what the trainer's logprob check must refuse):
#: ``random_tokens``: random tokens claimed at log-probability −0.01 each; ``copied_logprobs``: the honest
#: samples' log-probabilities on other (random) tokens of the same length.
FORGERIES = ("random_tokens", "copied_logprobs")


@dataclass(frozen=True)
class Emulation:
    slowdown: float = 1.0  # every batch takes this many times as long
    sim_tokens_per_s: float | None = None  # generation takes at least tokens / rate seconds
    # with sim_tokens_per_s: charge every sample its whole token budget (as a batched engine decoding to the
    # longest sample does), so emulated time no longer depends on sampled lengths (benchmarks: steady steps)
    sim_full_length: bool = False
    throttle_file: str | None = None  # while it exists, its content (tokens/s) caps generation, unseen
    claim_tokens_per_s: float | None = None  # report this rate instead of the measured one
    forge_rollouts: str | None = None  # one of FORGERIES: return forged rollouts instead of the sampled ones


class EmulatedEngine:
    """Wraps an engine: each ``generate`` is stretched to the emulated rate, then to the throttle file's cap."""

    def __init__(self, engine: Engine, emulation: Emulation) -> None:
        self.inner = engine
        self.emulation = emulation
        self.name = engine.name
        self.unseen_s = 0.0  # throttle sleeps so far: time the actor's own clock does not see
        self._rng = random.Random(0)

    @property
    def target(self):
        return self.inner.target

    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Completion]]:
        started = time.perf_counter()
        groups = self.inner.generate(prompts, group_size, max_new_tokens, temperature, seed)
        elapsed = time.perf_counter() - started
        e = self.emulation
        tokens = sum(len(c.ids) for group in groups for c in group)
        charged = len(prompts) * group_size * max_new_tokens if e.sim_full_length else tokens
        stretched = elapsed * max(e.slowdown, 1.0)
        if e.sim_tokens_per_s:
            stretched = max(stretched, charged / e.sim_tokens_per_s)
        if stretched > elapsed:
            time.sleep(stretched - elapsed)
        cap = self._throttle_cap()
        if cap > 0 and tokens / cap > stretched:
            pause = min(tokens / cap - stretched, 300.0)
            time.sleep(pause)
            self.unseen_s += pause
        if e.forge_rollouts:
            groups = [[_forged(c, e.forge_rollouts, self._rng) for c in group] for group in groups]
        return groups

    def _throttle_cap(self) -> float:
        if not self.emulation.throttle_file:
            return 0.0
        try:
            return float(Path(self.emulation.throttle_file).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def weights_changed(self) -> None:
        self.inner.weights_changed()

    def close(self) -> None:
        self.inner.close()


def _forged(completion: Completion, how: str, rng: random.Random) -> Completion:
    """Other tokens than were sampled (ids of the character alphabet, as the tokenizer produces), with made-up
    (``random_tokens``) or copied (``copied_logprobs``) log-probabilities; the text decodes nothing useful."""
    ids = tuple(rng.randrange(3, 18) for _ in completion.ids)
    logprobs = tuple(-0.01 for _ in ids) if how == "random_tokens" else completion.logprobs
    return Completion(ids, logprobs, completion.text)


class EmulatedThroughput(Throughput):
    """The actor's self-measurement of an emulated engine: throttling is left out (a slowdown it does not see),
    and a claimed rate replaces the measured one in its heartbeat."""

    def __init__(self, emulation: Emulation) -> None:
        super().__init__()
        self.emulation = emulation
        self.engine: EmulatedEngine | None = None

    def clock(self) -> float:
        return time.perf_counter() - (self.engine.unseen_s if self.engine is not None else 0.0)

    def reported(self) -> float:
        return self.emulation.claim_tokens_per_s or self.tokens_per_s


def parse(argv: list[str] | None) -> tuple[Emulation, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m workers.actor.emulated", add_help=False)
    parser.add_argument("--slowdown", type=float, default=1.0)
    parser.add_argument("--sim-tokens-per-s", type=float, default=None)
    parser.add_argument("--sim-full-length", action="store_true")
    parser.add_argument("--throttle-file")
    parser.add_argument("--claim-tokens-per-s", type=float, default=None)
    parser.add_argument("--forge-rollouts", choices=FORGERIES, default=None)
    args, rest = parser.parse_known_args(argv)
    return Emulation(args.slowdown, args.sim_tokens_per_s, args.sim_full_length, args.throttle_file,
                     args.claim_tokens_per_s, args.forge_rollouts), rest


def main(argv: list[str] | None = None) -> int:
    from workers.actor.actor import main as actor_main  # here: harnesses read FLAGS without loading torch

    emulation, rest = parse(argv)
    meter = EmulatedThroughput(emulation)

    def wrap(engine: Engine) -> Engine:
        meter.engine = EmulatedEngine(engine, emulation)
        return meter.engine

    return actor_main(rest, wrap_engine=wrap, meter=meter)


if __name__ == "__main__":  # vLLM's engine spawns processes that re-import this module
    raise SystemExit(main())
