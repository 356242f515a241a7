"""The production guard against silent name-mapping gaps: a trainer refuses to publish a model whose trainable
parameters the layout does not all ship, or whose layout names tensors the model lacks (a typed error naming
them, before step 0's publish); an actor refuses to attach an engine holding a parameter the layout does not
name (torch engine: the target refuses; vLLM: the worker's binding lists it)."""

from __future__ import annotations

import re

import pytest
import torch

from aurora_store.codec import ModelLayout, TensorTarget
from aurora_store.errors import LayoutCoverageError, LayoutError
from workers.integrations.hf_callback import StepPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import held_constants
from workers.rl.model import DEFAULT_CONFIG, build_model, built_in_config
from workers.trainer.policy import ShardedPolicy

LAYOUT = ModelLayout.from_config(DEFAULT_CONFIG)


def model_with_extra():
    model = build_model(DEFAULT_CONFIG, dtype=torch.bfloat16)
    # A trainable tensor the layout does not know, as an unsupported module (an adapter, a new head) would add.
    model.model.layers[1].extra_gate = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    return model


def test_trainer_refuses_a_trainable_parameter_the_layout_does_not_ship():
    with pytest.raises(LayoutCoverageError, match=re.escape("model.layers.1.extra_gate")) as caught:
        ShardedPolicy.shard(model_with_extra(), LAYOUT, Ranks())
    assert caught.value.uncovered == ("model.layers.1.extra_gate",) and caught.value.unsourced == ()
    assert isinstance(caught.value, LayoutError) and isinstance(caught.value, ValueError)


def test_a_frozen_extra_parameter_is_not_published_and_not_refused():
    model = model_with_extra()
    model.model.layers[1].extra_gate.requires_grad_(False)
    policy = ShardedPolicy.shard(model, LAYOUT, Ranks())
    assert set(policy.params) == set(LAYOUT.train_names)


def test_trainer_refuses_a_layout_tensor_the_model_does_not_hold():
    # A Llama model under a Qwen3 layout: the layout's q/k norms have no source.
    llama = build_model({**DEFAULT_CONFIG, "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
                        dtype=torch.bfloat16)
    with pytest.raises(LayoutCoverageError, match="q_norm") as caught:
        ShardedPolicy.shard(llama, LAYOUT, Ranks())
    assert "model.layers.0.self_attn.q_norm.weight" in caught.value.unsourced
    assert len(caught.value.unsourced) == 2 * DEFAULT_CONFIG["num_hidden_layers"]  # q_norm, k_norm per layer


def test_step_publisher_refuses_before_anything_is_written(tmp_path):
    publisher = StepPublisher(str(tmp_path / "bucket"), LAYOUT)
    with pytest.raises(LayoutCoverageError, match="extra_gate"):
        publisher.start(model_with_extra())
    bucket = tmp_path / "bucket"
    written = {p.relative_to(bucket).parts[0] for p in bucket.rglob("*") if p.is_file()}
    assert written <= {"layouts"} and publisher.store.latest_version() is None, "no version, no run info"


def test_torch_actor_refuses_an_engine_parameter_the_layout_does_not_name():
    params = dict(model_with_extra().named_parameters())
    with pytest.raises(LayoutError, match=re.escape("unexpected 1: ['model.layers.1.extra_gate']")):
        TensorTarget.from_state(LAYOUT, params)


def test_vllm_binding_lists_an_engine_parameter_the_layout_does_not_name():
    from workers.vllm.shards import bind_layout

    fused = LAYOUT.fuse(dict(build_model(DEFAULT_CONFIG, dtype=torch.bfloat16).named_parameters()))
    fused["model.layers.0.mlp.experts.routed_experts.w13_weight"] = torch.zeros(2, 4, 4, dtype=torch.bfloat16)
    shards, problems = bind_layout(LAYOUT, fused, 0, 1)
    assert problems == ["engine parameter model.layers.0.mlp.experts.routed_experts.w13_weight is not in the layout"]
    assert set(shards) == set(LAYOUT.names)


def test_the_deepseek_preset_passes_the_guard_and_holds_the_constants_its_snapshots_carry():
    """The trainer's DeepSeek-V3 preset: every trainable parameter is shipped and every layout tensor has a
    source; the router's correction bias is a buffer (not trained, not shipped) that snapshots carry as held."""
    config = built_in_config("deepseek_v3")
    layout = ModelLayout.from_config(config)
    policy = ShardedPolicy.shard(build_model(config), layout, Ranks())
    assert set(policy.params) == set(layout.train_names)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert set(held_constants(policy.model, layout)) == {bias} == {e.name for e in layout.engine_only
                                                                   if e.source is None}
    assert held_constants(policy.model, layout)[bias].dtype == torch.float32
    with pytest.raises(LayoutError, match="engine-only constants"):
        held_constants(build_model(DEFAULT_CONFIG), layout)  # a model without the buffer: refused, named
