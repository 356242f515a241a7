"""The scale benchmark's MoE size end to end on a few-MB Qwen3-MoE (real S3 server, real subprocesses): the
dense sizes' keys plus the step's density by part of the model, and the experts' split between those that got
a gradient at the step, those that moved on Adam's momentum alone and those that never had a gradient."""

from __future__ import annotations

import json

import pytest

from benchmarks import moe, scale
from tests.bench.test_scale_bench import KEYS


@pytest.mark.s3
def test_tiny_moe_scale_run_splits_the_density():
    result = scale.run(dict(moe.TINY_MOE), streams=2, repeats=1)
    figures = result["sizes"]["tiny-moe"]
    assert set(figures) >= KEYS | {"density_by_part", "expert_density_touched", "expert_density_momentum"}
    assert figures["bit_exact"]
    parts = figures["density_by_part"]
    assert set(parts) == set(moe.GROUPS)
    assert sum(figures["params_by_part"].values()) == figures["params"]
    assert sum(figures["changed_by_part"].values()) == figures["changed"]
    # Experts without a gradient at the step still move on Adam's momentum; those that never had one do not.
    assert figures["expert_density_touched"] > 0 and figures["expert_density_momentum"] > 0
    assert figures["expert_density_never"] in (0.0, None)
    assert sum(figures["expert_params_by_kind"].values()) == figures["params_by_part"]["experts"]
    json.dumps(result)


def test_the_moe_size_is_a_1b_qwen3_moe_with_64_experts_8_active():
    from aurora_store.codec import ModelLayout

    config = moe.MOE_SIZES["qwen3-moe-1b"]
    layout = ModelLayout.from_config(config)
    assert 0.9e9 < layout.numel < 1.2e9 and config["num_experts"] == 64 and config["num_experts_per_tok"] == 8
    assert moe.group_of("model.layers.3.mlp.experts.routed_experts.w13_weight") == "experts"
    assert moe.group_of("model.layers.3.mlp.gate.weight") == "router"
    assert moe.group_of("model.layers.3.self_attn.qkv_proj.weight") == "attention"
    assert moe.group_of("model.embed_tokens.weight") == "other"


def test_an_unknown_size_names_the_moe_one():
    with pytest.raises(SystemExit, match="qwen3-moe-1b"):
        scale.main(["--sizes", "qwen3-moe-9t"])
