"""The in-process tensor target runs the shipped weight-target conformance suite
(:mod:`aurora_store.testing.targets`) over a HuggingFace-style state: q/k/v and gate/up are separate tensors,
so every fused inference tensor is several storage pieces; and over gpt-oss's, whose expert tensors are stored
transposed against the engine's, so every write and read goes through an element order's position map."""

from __future__ import annotations

import pytest

from aurora_store.codec import ModelLayout, SupportsScatterPlan, TensorTarget, WeightTarget
from aurora_store.testing.builders import TINY_QWEN3, random_state
from aurora_store.testing.targets import TargetCase, WeightTargetConformance


class TestTensorTarget(WeightTargetConformance):
    @pytest.fixture()
    def weight_target_case(self) -> TargetCase:
        layout = ModelLayout.from_config(TINY_QWEN3)
        state = random_state(layout, seed=3)
        return TargetCase(TensorTarget.from_state(layout, {k: v.clone() for k, v in state.items()}, version=5),
                          state)


#: A small gpt-oss: 3 experts of intermediate size 24 (its expert tensors in an element order of their own).
TINY_GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "intermediate_size": 24, "num_hidden_layers": 2, "vocab_size": 37,
                "num_local_experts": 3, "attention_bias": True}


class TestTensorTargetOverTransposedExperts(WeightTargetConformance):
    @pytest.fixture()
    def weight_target_case(self) -> TargetCase:
        layout = ModelLayout.from_config(TINY_GPT_OSS)
        assert any(c.order for t in layout.tensors for c in t.components)
        state = random_state(layout, seed=4)
        return TargetCase(TensorTarget.from_state(layout, {k: v.clone() for k, v in state.items()}, version=2),
                          state)


def test_the_tensor_target_plans_its_scatters():
    layout = ModelLayout.from_config(TINY_QWEN3)
    target = TensorTarget.from_state(layout, random_state(layout), version=0)
    assert isinstance(target, WeightTarget) and isinstance(target, SupportsScatterPlan)
