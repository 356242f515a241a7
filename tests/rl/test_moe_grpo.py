"""GRPO on a mixture-of-experts policy (the built-in Qwen3-MoE preset): the router's load-balancing loss is part
of the trainer's loss exactly as transformers adds it to its own (``router_aux_loss_coef · aux_loss`` when
``output_router_logits``), and a dense model's loss is unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from aurora_store.errors import ConfigError
from tests.rl.test_kl import samples
from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig, GRPOLearner, group_advantages, grpo_loss, policy_logprobs, router_aux_coef
from workers.rl.model import DEFAULT_CONFIG, MOE_OVERRIDES, build_model, built_in_config
from workers.trainer.learner import ShardedLearner

ROUTER = "model.layers.0.mlp.gate.weight"


@pytest.fixture(scope="module")
def moe():
    return build_model(built_in_config("qwen3_moe"), seed=0)


def reference_step(model, coef: float) -> torch.nn.Module:
    """One step by hand: the clipped surrogate plus ``coef`` times transformers' aux loss of the same forward."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    batch = samples()
    adv = torch.tensor(group_advantages(batch))
    old = torch.zeros((len(batch), max(len(s.completion_ids) for s in batch)))
    for i, s in enumerate(batch):
        old[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs)
    model.train()
    new, mask, aux = policy_logprobs(model, batch)
    assert aux is not None and float(aux) > 0
    loss = grpo_loss(new, old, mask, adv, 0.2)[0] + coef * aux
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return model


def test_the_moe_preset_is_a_qwen3_moe_with_the_router_loss_on():
    config = built_in_config("qwen3_moe")
    assert config["model_type"] == "qwen3_moe" and config["num_experts"] == 8
    assert {**DEFAULT_CONFIG, **MOE_OVERRIDES} == config == built_in_config('{"preset": "qwen3_moe"}')
    assert built_in_config('{"preset": "qwen3_moe", "num_experts": 4}')["num_experts"] == 4
    with pytest.raises(ConfigError, match="unknown preset"):
        built_in_config('{"preset": "gpt2"}')
    with pytest.raises(ConfigError, match="preset"):
        built_in_config("qwen9")


@pytest.mark.parametrize("learner", ["single", "sharded"])
def test_a_moe_grpo_step_adds_transformers_router_loss(moe, learner):
    assert router_aux_coef(moe) == 0.01 and router_aux_coef(build_model(DEFAULT_CONFIG)) == 0.0
    model = copy.deepcopy(moe)
    config = GRPOConfig(lr=1e-3, epochs=1)
    step = GRPOLearner(model, config) if learner == "single" else ShardedLearner(model, config, Ranks())
    step.step(samples())
    with_aux, without = reference_step(moe, 0.01), reference_step(moe, 0.0)
    params = dict(model.named_parameters())
    for name, param in with_aux.named_parameters():
        assert torch.equal(params[name], param), name
    # The router loss moves the router: leaving it out gives a different step.
    moved = (params[ROUTER] - dict(without.named_parameters())[ROUTER]).abs().max()
    assert float(moved) > 1e-5
