"""``python -m benchmarks extract`` on a tiny model: both world sizes measured in one run, one JSON
object with the ratio, the 8-rank estimate and the host encoder against the device path."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import extract

pytestmark = pytest.mark.slow

TINY = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 37, "tie_word_embeddings": True}


def test_extract_bench_measures_one_and_two_ranks_in_one_run():
    result = extract.run(TINY, worlds=(1, 2), steps=2, rounds=1, segment_bytes=4096, path_threads=(1,),
                         path_repeats=1)
    json.dumps(result)
    # The host encoder and the device path on CPU, in their own process with passive OpenMP threads.
    assert result["threads"] == 1 and result["paths_byte_identical"] and result["omp_wait_policy"] == os.environ.get(
        "OMP_WAIT_POLICY", "PASSIVE")
    assert result["device_vs_host"] == pytest.approx(result["device_path_s"] / result["host_path_s"])
    one, two = result["worlds"]["1"], result["worlds"]["2"]
    assert one["ranks"] == 1 and two["ranks"] == 2 and one["steps"] == two["steps"] == 2
    assert sum(two["rank_elements"]) == one["rank_elements"][0] == result["model"]["parameters"]
    assert one["changed"] == two["changed"] > 0  # same versions, same changes, whatever the sharding
    assert all(s > 0 for s in two["rank_scan_numpy_s"]) and len(two["rank_encode_vs_numpy_scan"]) == 2
    assert result["speedup_1_to_2"] == pytest.approx(one["wall_s"] / two["wall_s"])
    estimate = result["estimate_8_ranks_qwen3_8b"]
    assert estimate["step_s"] == pytest.approx(estimate["parameters"] / 8 / estimate["rank_elements_per_s"]
                                               + estimate["overhead_s"])
