"""The emulating actor's engine wrapper: batches stretched to the emulated rate (seen by the actor's own
clock), throttling that its clock does not see, a claimed rate in place of the measured one, and the flags
split between the emulation and the actor's own command line."""

from __future__ import annotations

import time

from workers.actor.emulated import FLAGS, EmulatedEngine, EmulatedThroughput, Emulation, parse
from workers.engines import Completion


class CountingEngine:
    """An engine that answers at once: ``max_new_tokens`` tokens per sample."""

    name = "counting"
    target = None

    def __init__(self) -> None:
        self.changed = self.closed = 0

    def generate(self, prompts, group_size, max_new_tokens, temperature, seed):
        return [[Completion(tuple(range(max_new_tokens)), (0.0,) * max_new_tokens, "") for _ in range(group_size)]
                for _ in prompts]

    def weights_changed(self) -> None:
        self.changed += 1

    def close(self) -> None:
        self.closed += 1


def test_a_batch_takes_as_long_as_the_emulated_rate_says_and_the_actor_sees_it():
    meter = EmulatedThroughput(Emulation(sim_tokens_per_s=200.0))
    engine = meter.engine = EmulatedEngine(CountingEngine(), meter.emulation)
    started = meter.clock()
    groups = engine.generate(["a", "b"], 2, 10, 1.0, seed=0)  # 40 tokens at 200/s: 0.2 s
    elapsed = meter.clock() - started
    assert sum(len(c.ids) for g in groups for c in g) == 40
    assert 0.19 <= elapsed < 1.0
    meter.observe(40, elapsed, full_batch=True)
    assert 0.3 * 40 / 1.0 < meter.reported() <= 0.3 * 200 * 1.01


def test_throttling_is_invisible_to_the_self_measurement(tmp_path):
    cap = tmp_path / "cap"
    cap.write_text("100")
    meter = EmulatedThroughput(Emulation(throttle_file=str(cap)))
    engine = meter.engine = EmulatedEngine(CountingEngine(), meter.emulation)
    wall, started = time.perf_counter(), meter.clock()
    engine.generate(["a"], 2, 10, 1.0, seed=0)  # 20 tokens capped at 100/s: 0.2 s of wall time
    assert time.perf_counter() - wall >= 0.19
    assert meter.clock() - started < 0.1, "the throttle's pause reached the actor's own clock"
    cap.write_text("")  # no cap any more
    wall = time.perf_counter()
    engine.generate(["a"], 2, 10, 1.0, seed=0)
    assert time.perf_counter() - wall < 0.1


def test_a_claimed_rate_replaces_the_measured_one():
    meter = EmulatedThroughput(Emulation(claim_tokens_per_s=1e6))
    meter.observe(10, 1.0, full_batch=True)
    assert meter.tokens_per_s == 3.0 and meter.reported() == 1e6


def test_the_wrapper_passes_weight_changes_and_closing_through():
    inner = CountingEngine()
    engine = EmulatedEngine(inner, Emulation(slowdown=2.0))
    engine.weights_changed()
    engine.close()
    assert (inner.changed, inner.closed) == (1, 1) and engine.name == "counting"


def test_emulation_flags_are_taken_and_the_rest_goes_to_the_actor():
    emulation, rest = parse(["--bucket", "b", "--sim-tokens-per-s", "7", "--sim-full-length", "--claim-tokens-per-s",
                             "9", "--region", "r", "--throttle-file", "/tmp/x", "--slowdown", "3",
                             "--forge-rollouts", "copied_logprobs"])
    assert emulation == Emulation(3.0, 7.0, True, "/tmp/x", 9.0, "copied_logprobs")
    assert rest == ["--bucket", "b", "--region", "r"]
    assert set(FLAGS) == {"--slowdown", "--sim-tokens-per-s", "--sim-full-length", "--throttle-file",
                          "--claim-tokens-per-s", "--forge-rollouts"}


def test_the_production_actor_has_no_emulation_flags():
    from workers.actor.cli import build_parser

    options = {s for action in build_parser()._actions for s in action.option_strings}
    assert not options & set(FLAGS)
