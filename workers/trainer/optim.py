"""A memory-lean AdamW for real model sizes on small machines: ``--optimizer adamw-bf16``.

The fp32 master weights stay (the published policy is their bf16 cast, as with the default AdamW); what
shrinks is everything around them:

* both moments are kept in bf16 (4 bytes per parameter instead of 8), and updated chunk by chunk in fp32,
  so the update itself is computed at full precision and only the stored moments are rounded;
* each parameter is stepped as soon as its gradient is complete (a post-accumulate-grad hook) and its
  gradient is freed right away, so the full set of fp32 gradients (4 bytes per parameter) never exists.

Stepping during backward means there is no global gradient-norm clipping (the norm is only known once every
gradient has been used); Adam's update is invariant to the gradient's scale, so at small learning rates this
changes little. The pre-update gradient norm is still measured and reported. For Qwen3-0.6B (0.6 B
parameters) the trainer's resident state is ~4.8 GB instead of ~9.6 GB (master + grads + fp32 moments).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

_CHUNK = 1 << 22  # elements updated at once: bounds the fp32 temporaries to a few × 16 MiB


class LeanAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected) with bf16 moments; see the module docstring."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self._sq_norm = 0.0

    # --- stepping ----------------------------------------------------------------------------------

    @torch.no_grad()
    def step_param(self, param: torch.Tensor) -> None:
        """Update one parameter from its gradient and free the gradient."""
        grad = param.grad
        if grad is None:
            return
        group = next(g for g in self.param_groups if any(p is param for p in g["params"]))
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        t = float(state["step"])
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        step_size = lr / (1 - beta1 ** t)
        correction2 = math.sqrt(1 - beta2 ** t)
        p, g = param.view(-1), grad.view(-1)
        m_all, v_all = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
        self._sq_norm += float(g.float().pow(2).sum())
        for lo in range(0, p.numel(), _CHUNK):
            hi = min(lo + _CHUNK, p.numel())
            g32 = g[lo:hi].float()
            m = m_all[lo:hi].float().mul_(beta1).add_(g32, alpha=1 - beta1)
            v = v_all[lo:hi].float().mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
            m_all[lo:hi] = m  # rounded to bf16 for storage only
            v_all[lo:hi] = v
            if wd:
                p[lo:hi].mul_(1 - lr * wd)
            p[lo:hi].addcdiv_(m, v.sqrt_().div_(correction2).add_(eps), value=-step_size)
        param.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        """Step every parameter that still holds a gradient (when not stepping inside backward)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                self.step_param(param)
        return loss

    def step_in_backward(self) -> None:
        """Step each parameter from a hook as soon as backward has accumulated its gradient."""
        for group in self.param_groups:
            for param in group["params"]:
                param.register_post_accumulate_grad_hook(self.step_param)

    def take_grad_norm(self) -> float:
        """The L2 norm of the gradients used since the last call (measured before each update)."""
        norm, self._sq_norm = math.sqrt(self._sq_norm), 0.0
        return norm

    # --- state -------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict) -> None:
        # torch casts floating state to the parameter's dtype (fp32): the moments go back to bf16.
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)
