"""The lean AdamW (bf16 moments, stepped during backward): the same updates as torch's AdamW up to the
moments' rounding, no gradients left behind, and bf16 moments surviving a checkpoint round trip."""

from __future__ import annotations

import torch

from workers.trainer.optim import LeanAdamW


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)
    return torch.nn.functional.mse_loss(model(x), y)


def test_matches_adamw_and_frees_every_gradient():
    reference, lean_model = _model(0), _model(0)
    adamw = torch.optim.AdamW(reference.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    lean = LeanAdamW(lean_model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    lean.step_in_backward()
    start = [p.detach().clone() for p in reference.parameters()]
    for step in range(5):
        adamw.zero_grad()
        _loss(reference, step).backward()
        adamw.step()
        _loss(lean_model, step).backward()  # the hooks step every parameter
        assert all(p.grad is None for p in lean_model.parameters())
        assert lean.take_grad_norm() > 0
    for a, b, s in zip(reference.parameters(), lean_model.parameters(), start):
        moved = (a - s).abs().max()
        assert moved > 1e-3  # both really trained
        assert (a - b).abs().max() < 0.02 * moved  # bf16 moments: the same steps up to their rounding
    state = lean.state[next(lean_model.parameters())]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def test_moments_stay_bf16_after_loading_a_state_dict():
    model = _model(1)
    lean = LeanAdamW(model.parameters(), lr=1e-3)
    _loss(model, 0).backward()
    lean.step()
    saved = lean.state_dict()
    again = LeanAdamW(model.parameters(), lr=1e-3)
    again.load_state_dict(saved)
    for state in again.state.values():
        assert state["exp_avg"].dtype == torch.bfloat16 and state["exp_avg_sq"].dtype == torch.bfloat16
        assert float(state["step"]) == 1.0
