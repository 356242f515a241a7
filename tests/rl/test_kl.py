"""GRPO's KL term to a frozen reference policy (the initial weights, bf16): ``--kl-coef 0`` is today's loss
bit for bit; a positive coefficient adds β_KL·k3 to the loss and changes the gradients."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig, Sample, grpo_loss
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.trainer.cli import parse_args
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import frozen_reference


def samples() -> list[Sample]:
    rng = random.Random(3)
    out = []
    for prompt in range(3):
        prompt_ids = tuple(rng.randrange(3, 30) for _ in range(5))
        for _ in range(4):
            completion = tuple(rng.randrange(3, 30) for _ in range(rng.randrange(2, 6)))
            out.append(Sample(prompt_ids, completion, tuple(-rng.uniform(2.0, 4.0) for _ in completion),
                              float(rng.random() < 0.5), f"p{prompt}"))
    return out


@pytest.fixture(scope="module")
def models():
    """The initial policy, its frozen reference, and the policy after moving away from it."""
    torch.manual_seed(0)
    initial = build_model(DEFAULT_CONFIG, seed=0)
    reference = frozen_reference(initial, Ranks())
    moved = copy.deepcopy(initial)
    with torch.no_grad():
        for param in moved.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return initial, reference, moved


def one_step(model, kl_coef: float, reference):
    model = copy.deepcopy(model)
    learner = ShardedLearner(model, GRPOConfig(lr=1e-4, kl_coef=kl_coef, epochs=1), Ranks(), reference)
    stats = learner.step(samples())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return stats, grads, model


def test_the_reference_is_a_frozen_bf16_copy_of_the_initial_weights(models):
    initial, reference, _ = models
    params = dict(reference.named_parameters())
    assert params and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in params.values())
    for name, param in initial.named_parameters():
        assert torch.equal(params[name], param.detach().to(torch.bfloat16)), name
    assert all(p.dtype == torch.float32 for p in initial.parameters())  # the policy is untouched


def test_kl_coef_zero_is_todays_loss_and_gradient_exactly(models):
    _, reference, moved = models
    plain, plain_grads, _ = one_step(moved, 0.0, None)
    zero, zero_grads, _ = one_step(moved, 0.0, reference)  # a reference handed in is ignored at 0
    assert zero.loss == plain.loss and zero.kl == plain.kl == 0.0
    assert plain_grads.keys() == zero_grads.keys()
    assert all(torch.equal(plain_grads[n], zero_grads[n]) for n in plain_grads)


def test_the_penalty_changes_loss_and_gradients_and_is_reported(models):
    _, reference, moved = models
    plain, plain_grads, _ = one_step(moved, 0.0, None)
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}
    kl, kl_grads, _ = one_step(moved, 0.5, reference)
    assert kl.kl > 1e-4  # the moved policy differs from the reference
    # one epoch: same surrogate, plus β_KL times the token-mean k3
    assert kl.loss == pytest.approx(plain.loss + 0.5 * kl.kl, rel=1e-4, abs=1e-6)
    changed = [n for n in plain_grads if not torch.allclose(plain_grads[n], kl_grads[n], rtol=1e-4, atol=1e-7)]
    assert len(changed) >= len(plain_grads) // 2, changed
    assert all(torch.equal(before[n], p) for n, p in reference.named_parameters())  # frozen


def test_at_the_reference_the_penalty_is_zero_and_pulls_back_when_moved(models):
    initial, reference, _ = models
    at_ref, _, _ = one_step(initial, 0.5, reference)
    assert at_ref.kl < 1e-3  # only bf16 rounding of the reference separates them
    # k3 is non-negative and zero iff the log-probabilities agree
    new = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.ones_like(new)
    loss, extra = grpo_loss(new, new.detach(), mask, torch.zeros(1), 0.2, ref=new.detach() - 0.3, kl_coef=1.0)
    assert extra["kl"] == pytest.approx(float(torch.exp(torch.tensor(-0.3)) + 0.3 - 1), rel=1e-6)
    loss.backward()
    assert (new.grad > 0).all()  # the gradient step lowers new towards ref


def test_the_trainer_refuses_a_negative_kl_coef(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--bucket", "b", "--redis", "redis://x", "--checkpoint-dir", "c", "--kl-coef", "-0.1"])
    assert "--kl-coef" in capsys.readouterr().err
    for flag in ("--throughput-ema", "--exclusion-decay"):
        with pytest.raises(SystemExit):
            parse_args(["--bucket", "b", "--redis", "redis://x", "--checkpoint-dir", "c", flag, "0"])
