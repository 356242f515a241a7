"""``python -m benchmarks extract`` on a tiny model: both world sizes measured in one run, one JSON
object with the ratio and the 8-rank estimate."""

from __future__ import annotations

import json

import pytest

from benchmarks import extract

pytestmark = pytest.mark.slow

TINY = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 37, "tie_word_embeddings": True}


def test_extract_bench_measures_one_and_two_ranks_in_one_run():
    result = extract.run(TINY, worlds=(1, 2), steps=2, rounds=1, segment_bytes=4096)
    json.dumps(result)
    one, two = result["worlds"]["1"], result["worlds"]["2"]
    assert one["ranks"] == 1 and two["ranks"] == 2 and one["steps"] == two["steps"] == 2
    assert sum(two["rank_elements"]) == one["rank_elements"][0] == result["model"]["parameters"]
    assert one["changed"] == two["changed"] > 0  # same versions, same changes, whatever the sharding
    assert all(s > 0 for s in two["rank_scan_numpy_s"]) and len(two["rank_encode_vs_numpy_scan"]) == 2
    assert result["speedup_1_to_2"] == pytest.approx(one["wall_s"] / two["wall_s"])
    estimate = result["estimate_8_ranks_qwen3_8b"]
    assert estimate["step_s"] == pytest.approx(estimate["parameters"] / 8 / estimate["rank_elements_per_s"]
                                               + estimate["overhead_s"])
