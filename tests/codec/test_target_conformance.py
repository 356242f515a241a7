"""The in-process tensor target runs the shipped weight-target conformance suite
(:mod:`aurora_store.testing.targets`) over a HuggingFace-style state: q/k/v and gate/up are separate tensors,
so every fused inference tensor is several storage pieces."""

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


def test_the_tensor_target_plans_its_scatters():
    layout = ModelLayout.from_config(TINY_QWEN3)
    target = TensorTarget.from_state(layout, random_state(layout), version=0)
    assert isinstance(target, WeightTarget) and isinstance(target, SupportsScatterPlan)
