"""``python -m benchmarks extract``'s comparison of the host encoder and the device path on CPU tensors, on a
few-MB model: both encode the same step at each thread count, byte-identically, and the ratio is theirs."""

from __future__ import annotations

import argparse

import pytest

from aurora_store.codec import ModelLayout
from benchmarks import extract

TINY = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512,
        "tie_word_embeddings": True}


def test_both_paths_encode_the_same_step_at_equal_thread_counts(tmp_path):
    layout = ModelLayout.from_config(TINY)
    versions = extract._versions(layout, 1, 1e-6, 2, tmp_path)
    result = extract.encode_paths(layout, versions, threads=(1, 2), repeats=1, segment_bytes=4096)
    assert result["paths_byte_identical"] and result["paths_elements"] == layout.numel
    assert 0 < result["paths_changed"] < result["paths_elements"] / 10  # an Adam step's sparse delta
    assert result["threads"] == 2 and set(result["paths_by_threads"]) == {"1", "2"}
    for figures in result["paths_by_threads"].values():
        assert figures["device_vs_host"] == pytest.approx(figures["device_path_s"] / figures["host_path_s"])
    assert result["device_vs_host"] == result["paths_by_threads"]["2"]["device_vs_host"]


def test_nothing_to_measure_is_refused():
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    with pytest.raises(ValueError, match="nothing to measure"):
        extract.main(TINY, parser.parse_args(["--ranks", "", "--path-threads", ""]))
