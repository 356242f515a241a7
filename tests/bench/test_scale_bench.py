"""The scale benchmark end to end on two few-MB models: real S3 server, real subprocesses, one JSON object."""

from __future__ import annotations

import json

import pytest

from benchmarks import scale

KEYS = {"params", "density", "bytes_per_changed", "delta_bytes", "full_bytes", "publish_s", "publish_vs_scan",
        "activate_s", "activate_vs_scatter", "snapshot_write_s", "snapshot_load_s", "publisher_peak_rss_vs_model",
        "actor_peak_rss_vs_model", "stage_s", "stage_vs_scatter", "fetch_stage_activate_s", "publish_median_s",
        "publisher_baseline_rss_vs_model", "publisher_peak_rss_above_baseline_vs_model",
        "publisher_phase_peak_rss_vs_model",
        # Against the baselines at the limit (benchmarks.baselines), measured in the same run.
        "scan_numpy_s", "publish_vs_numpy_scan", "encode_vs_numpy_scan", "digest_vs_sha256",
        "snapshot_write_vs_raw_put", "snapshot_load_vs_raw_get", "threads", "sha256_s", "read_both_s",
        "raw_put_s", "raw_get_s", "scatter_baseline_s", "ns_per_element", "ns_per_changed"}


@pytest.mark.s3
def test_tiny_scale_run_prints_sane_figures():
    # One few-MB size through every real path (the growth fit over several sizes: the merge test below).
    result = scale.run({"tiny-b": scale.TINY["tiny-b"]}, streams=2)
    figures = result["sizes"]["tiny-b"]
    assert set(figures) >= KEYS
    assert figures["bit_exact"]  # the actor ended on exactly the generated new version
    assert 0.005 < figures["density"] < 0.05  # lr 1e-6 Adam steps: the sparse regime
    assert figures["delta_bytes"] < figures["full_bytes"] / 20
    assert figures["bytes_per_changed"] == pytest.approx(figures["delta_bytes"] / figures["changed"])
    assert figures["snapshot_bytes"] >= figures["full_bytes"]
    # Staging and activation are timed apart; the combined figure is the follower's fetch + stage plus the
    # first activation; staging alone (segments in memory) excludes the fetch.
    assert figures["fetch_stage_activate_s"] == pytest.approx(figures["fetch_stage_s"] + figures["first_activate_s"])
    assert len(figures["publish_all_s"]) == result["repeats"] == 3
    # The publisher's raw peak, broken down: the process before the weights plus what came on top of it; no
    # phase peaks above the whole, and the publish phase (both versions resident) sits above the baseline.
    raw, base = figures["publisher_peak_rss_vs_model"], figures["publisher_baseline_rss_vs_model"]
    assert 0 < base < raw
    assert base + figures["publisher_peak_rss_above_baseline_vs_model"] == pytest.approx(raw)
    phases = figures["publisher_phase_peak_rss_vs_model"]
    assert set(phases) == {"imports", "warmup_scan", "scan", "publish", "limits"}
    for key in ("publish_vs_numpy_scan", "encode_vs_numpy_scan", "digest_vs_sha256", "stage_vs_scatter",
                "snapshot_write_vs_raw_put", "snapshot_load_vs_raw_get"):
        assert 0 < figures[key] < 1000, key
    assert figures["threads"]["baselines"] == figures["threads"]["paths"] == 1
    assert set(figures["threads"]["speedup_2_threads"]) == {"encode", "digest", "stage"}
    assert max(phases.values()) <= raw and phases["publish"] > base
    for key in ("publish_s", "activate_s", "snapshot_write_s", "snapshot_load_s", "publish_vs_scan",
                "activate_vs_scatter", "publisher_peak_rss_vs_model", "actor_peak_rss_vs_model"):
        assert figures[key] > 0, key
    assert result["publish_exponent"] is None  # one size: nothing to fit, and nothing invented
    big = result["extrapolated_qwen3_8b"]
    assert big["params"] > 8e9 and big["delta_bytes"] > 0 and "publish_s" not in big
    assert big["paper"] == {"delta_bytes": 202e6, "extraction_s": 5.0}
    json.dumps(result)


def test_sizes_that_do_not_fit_are_skipped_with_the_reason(capsys):
    assert scale.main(["--sizes", "qwen3-4b", "--memory-budget-gib", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    skipped = result["sizes"]["qwen3-4b"]
    assert "GiB" in skipped["skipped"] and skipped["params"] > 4e9
    assert result["publish_exponent"] is None and "publish_s" not in result["extrapolated_qwen3_8b"]


def test_limit_exponents_are_normalised_to_the_in_run_baselines():
    # The path grows like params^1.1 while its baseline grows linearly: ratio ∝ params^0.1, normalised 1.1.
    sizes = [{"params": p, "publish_s": 1e-9 * p ** 1.1, "publish_vs_numpy_scan": 3 * p ** 0.1,
              "snapshot_load_s": 1e-9 * p, "snapshot_load_vs_raw_get": 0.6} for p in (1e8, 1e9, 4e9)]
    exponents = scale.limit_exponents(sizes)
    assert set(exponents) == {"publish", "snapshot_load"}
    assert exponents["publish"]["raw"] == pytest.approx(1.1)
    assert exponents["publish"]["baseline_normalised"] == pytest.approx(1.1)
    assert exponents["snapshot_load"]["baseline_normalised"] == pytest.approx(1.0)  # a constant fraction of GET


def test_merge_fits_sizes_measured_by_separate_runs():
    def run_output(name: str, params: float) -> dict:
        figures = {"params": params, "publish_s": 2e-9 * params ** 1.05, "activate_s": 3e-8 * params,
                   "bytes_per_changed": 1.2, "density": 0.02}
        return {"streams": 4, "lr": 1e-6, "warmup_steps": 2, "memory_budget_gib": 8.5, "sizes": {name: figures}}

    merged = scale.merge([run_output("a", 1e8), run_output("b", 1e9), {**run_output("c", 4e9),
                                                                       "sizes": {"c": {"skipped": "no room"}}}])
    assert set(merged["sizes"]) == {"a", "b", "c"} and merged["merged_runs"] == 3
    assert merged["publish_exponent"] == pytest.approx(1.05)
    assert merged["exponents"] == {}  # no baseline ratios in these outputs: no normalised exponent invented
    assert merged["activate_exponent"] == pytest.approx(1.0)
    big = merged["extrapolated_qwen3_8b"]
    assert big["publish_s"] == pytest.approx(2e-9 * big["params"] ** 1.05, rel=1e-6)
    assert big["delta_bytes"] == pytest.approx(1.2 * 0.02 * big["params"])
