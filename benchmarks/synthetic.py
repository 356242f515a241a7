"""Realistic synthetic policy updates: Adam steps at a small learning rate on bf16-published weights.

Used by benchmarks and tests that need deltas shaped like RL fine-tuning (1–4 % of bf16 elements change
per step, most by one ulp) without a real training run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from aurora_store.codec.layout import ModelLayout

#: A Qwen3-shaped decoder of ~0.22 B parameters (Qwen3-0.6B's widths, 12 layers, a 32k vocabulary).
QWEN3_BENCH_CONFIG: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072, "num_hidden_layers": 12, "vocab_size": 32000,
    "tie_word_embeddings": True,
}


def init_weights(layout: ModelLayout, seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 weights initialised like a real model: N(0, 0.02) matrices, ones for norms."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for tensor in layout.tensors:
        for comp in tensor.components:
            shape = tensor.component_shape(comp)
            if len(shape) == 1 and "norm" in comp.train_name:
                state[comp.train_name] = torch.ones(shape)
            elif len(shape) == 1:
                state[comp.train_name] = torch.zeros(shape)
            else:
                state[comp.train_name] = torch.randn(shape, generator=gen) * 0.02
    return state


class AdamSimulator:
    """fp32 master weights + Adam state, stepped with random gradients; publishes bf16 casts."""

    def __init__(self, layout: ModelLayout, lr: float = 1e-6, seed: int = 0) -> None:
        self.layout = layout
        self.lr = lr
        # Master weights start from the bf16 checkpoint, as when fine-tuning a released model.
        self.master = {k: v.to(torch.bfloat16).float() for k, v in init_weights(layout, seed).items()}
        self.m = {k: torch.zeros_like(v) for k, v in self.master.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.master.items()}
        self.t = 0
        self.gen = torch.Generator().manual_seed(seed + 1)

    def step(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.t += 1
        c1, c2 = 1 - beta1**self.t, 1 - beta2**self.t
        for name, w in self.master.items():
            grad = torch.randn(w.shape, generator=self.gen) * (1.0 / math.sqrt(max(w.numel(), 1)))
            self.m[name].mul_(beta1).add_(grad, alpha=1 - beta1)
            self.v[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            w.addcdiv_(self.m[name], self.v[name].div(c2).sqrt_().add_(eps), value=-self.lr / c1)

    def published(self) -> dict[str, torch.Tensor]:
        """The bf16 policy an actor would run."""
        return {k: v.to(torch.bfloat16) for k, v in self.master.items()}


def chained_states(layout: ModelLayout, steps: int, lr: float = 1e-6, seed: int = 0,
                   warmup: int = 0) -> list[Mapping[str, torch.Tensor]]:
    sim = AdamSimulator(layout, lr, seed)
    for _ in range(warmup):
        sim.step()
    states = [sim.published()]
    for _ in range(steps):
        sim.step()
        states.append(sim.published())
    return states
