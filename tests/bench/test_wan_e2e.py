"""Part 5 of the WAN benchmark on its own in quick mode: ``python -m benchmarks wan --quick --parts e2e --json``.

Needs root and network namespaces (skipped with the reason otherwise), like ``test_wan_bench``, whose teardown
discipline it shares: the run is ended by signal on timeout and must leave no namespace or process behind. The
quick run is one round (one short run per mode); the full benchmark's precision target is checked by its full
run, not here: this checks that every mode is measured, that each ratio comes with its 95 % interval around it,
and that the interval is no wider than the quick configuration's target.
"""

from __future__ import annotations

import pytest

from benchmarks.wan.netns import unsupported_reason
from tests.bench.wan_run import run_wan_benchmark

# Three short real runs across the emulated WAN, ~4 minutes alone on the machine: in `make test-long`, not `make
# test` (whose WAN test checks parts 1-4 in one run; every process kind it starts is exercised there too).
pytestmark = [pytest.mark.redis, pytest.mark.s3, pytest.mark.slow, pytest.mark.serial, pytest.mark.long,
              pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")]

TIMEOUT_S = 1200  # about four minutes on idle cores; over twelve when four other jobs share them


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-wan-e2e")
    return run_wan_benchmark(out, ["--quick", "--parts", "e2e"], TIMEOUT_S), out


def test_every_mode_is_measured(e2e):
    doc, out = e2e
    assert doc["errors"] == {}, doc["errors"]
    part = doc["e2e"]
    cfg = part["config"]
    assert part["rounds_done"] == cfg["rounds"]
    for mode in ("ideal", "delta", "full"):
        stats = doc["e2e_modes"][mode]
        steps = cfg["full_steps"] if mode == "full" else cfg["steps"]
        assert stats["intervals"] == part["rounds_done"] * (steps - cfg["skip_steps"])
        assert stats["mean_step_s"] > 0 and stats["median_step_s"] > 0 and stats["stdev_step_s"] >= 0
        for rnd in part["rounds"]:
            run = rnd["runs"][mode]
            assert "--sim-full-length" in run["actor_args"]
            assert any(a.endswith("warm-model") for a in run["trainer_args"])  # warm-started once, not per run
            assert (out / "e2e" / f"e2e-{mode}-r{run['round']}" / "logs" / "runlog.json").stat().st_size > 0
    full = part["rounds"][0]["runs"]["full"]
    assert full["cross_region_down_bytes"] > part["rounds"][0]["runs"]["delta"]["cross_region_down_bytes"]


def test_ratios_come_with_their_intervals(e2e):
    doc, _ = e2e
    width = doc["e2e"]["config"]["target_ci_half_width"]
    for key in ("e2e_delta_vs_ideal", "e2e_full_vs_delta"):
        point, (low, high) = doc[key], doc[f"{key}_ci95"]
        assert low <= point <= high, (key, point, low, high)
    point, (low, high) = doc["e2e_delta_vs_ideal"], doc["e2e_delta_vs_ideal_ci95"]
    assert max(point - low, high - point) <= width * point, (point, low, high)
    target = doc["targets"]["e2e_delta_vs_ideal"]
    assert target["ci95"] == [low, high] and target["met"] in (True, False)
