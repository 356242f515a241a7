"""Part 5's pieces that need no root: round order, step intervals, the actor's full-length emulation flag."""

from __future__ import annotations

from collections import Counter

from benchmarks.wan_bench.e2e import round_order, step_times


def test_every_mode_takes_every_position_equally_often():
    modes = ("ideal", "delta", "full")
    orders = [round_order(modes, i) for i in range(6)]
    assert orders[0] == ["ideal", "delta", "full"] and orders[1] == ["delta", "full", "ideal"]
    for position in range(3):
        assert Counter(o[position] for o in orders) == Counter(dict.fromkeys(modes, 2))


def test_step_intervals_leave_out_the_bootstrap():
    records = [{"step": str(s), "id": f"{ms}-0"} for s, ms in ((3, 30_000), (1, 10_000), (2, 21_000), (4, 38_500))]
    assert step_times(records, 2) == [9.0, 8.5]  # steps 3 and 4; the 1 → 2 interval is bootstrap
    assert step_times(records, 0) == [11.0, 9.0, 8.5]


def test_actor_sim_full_length_charges_the_whole_budget():
    """With ``--sim-full-length`` an emulated batch takes samples × budget / rate, whatever was sampled."""
    import time

    from workers.actor.emulated import EmulatedEngine, parse
    from workers.engines import Completion

    class OneToken:
        name, target = "one", None

        def generate(self, prompts, group_size, max_new_tokens, temperature, seed):
            return [[Completion((1,), (0.0,), "") for _ in range(group_size)] for _ in prompts]

    common = ["--bucket", "b", "--redis", "redis://x", "--region", "r", "--engine", "torch", "--sim-tokens-per-s", "80"]
    plain, rest = parse(common)
    full, _ = parse([*common, "--sim-full-length"])
    assert plain.sim_full_length is False and full.sim_full_length is True and "--sim-tokens-per-s" not in rest
    for emulation, expected in ((full, 2 * 4 * 4 / 80), (plain, 2 * 4 / 80)):  # 2 prompts × 4 samples, budget 4
        started = time.perf_counter()
        EmulatedEngine(OneToken(), emulation).generate(["a", "b"], 4, 4, 1.0, seed=0)  # type: ignore[arg-type]
        assert expected <= time.perf_counter() - started < expected + 0.15


def test_delta_sf_mode_waits_for_the_manifest_and_reads_no_relay_cache():
    """``delta_sf`` is ``delta`` without the last hop's overlap; the flags are the real CLIs' own."""
    from benchmarks.wan_bench.config import E2EConfig
    from benchmarks.wan_bench.e2e import mode_args
    from workers.actor.cli import parse_args
    from workers.actor.emulated import parse
    from workers.relay.cli import build_parser

    cfg = E2EConfig()
    delta_actor, delta_relay = mode_args(cfg, "delta")
    sf_actor, sf_relay = mode_args(cfg, "delta_sf")
    assert sf_actor == [*delta_actor, "--no-prefetch"] and delta_relay == [] and sf_relay == ["--no-serve-cache"]
    common = ["--bucket", "file:///tmp/x", "--redis", "redis://127.0.0.1:1/0", "--region", "r"]
    assert parse_args([*common, *parse(delta_actor)[1]]).prefetch is True  # the emulating actor's own flags aside
    assert parse_args([*common, *parse(sf_actor)[1]]).prefetch is False
    relay = build_parser().parse_args(["--source", "file:///a", "--dest", "file:///b", "--region", "r",
                                       "--redis", "redis://127.0.0.1:1/0", *sf_relay])
    assert relay.serve_cache is False


def test_e2e_modes_option_rejects_unknown_modes():
    import argparse

    import pytest

    from benchmarks.wan_bench.cli import add_arguments, run_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit, match=r"unknown.*bogus"):
        run_from_args(parser.parse_args(["--quick", "--parts", "e2e", "--e2e-modes", "ideal,bogus", "--quiet"]))
