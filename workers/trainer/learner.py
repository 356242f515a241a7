"""GRPO over data-parallel ranks, with the single-process loss.

Every rank receives the whole batch (so group advantages and the token count are computed over all of
it), computes the clipped surrogate on its own contiguous slice of samples, and scales it so that the
gradients FSDP averages over ranks equal the gradient of the single-process loss, the token mean over the
whole batch:

    loss_r = (Σ_{tokens of slice r} ℓ) / T · W      ⇒      (1/W) Σ_r ∇loss_r = ∇ (Σ_{all tokens} ℓ) / T

With one rank the scale is exactly 1 and the step is :class:`~workers.rl.grpo.GRPOLearner`'s.

With ``kl_coef > 0`` and a ``reference`` (the frozen bf16 initial policy, sharded like the policy), every
token's loss gains ``β_KL · k3``, the low-variance estimator of KL(π_θ ‖ π_ref):
``k3 = exp(ref − new) − (ref − new) − 1`` (non-negative, unbiased). With ``kl_coef == 0`` no reference
forward runs and the loss is exactly the clipped surrogate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from aurora_store.codec.sharding import even_rows
from aurora_store.errors import ConfigError
from workers.publish.ranks import Ranks
from workers.rl.grpo import (
    DEFAULT_LOGITS_CHUNK,
    GRPOConfig,
    Sample,
    StepStats,
    group_advantages,
    grpo_loss,
    policy_logprobs,
    router_aux_coef,
    token_logprobs,
)
from workers.trainer.optim import LeanAdamW


class ShardedLearner:
    """fp32 master weights (sharded or not) + AdamW; one optimizer step per epoch over a batch of rollouts.

    ``optimizer="adamw-bf16"`` (one rank only) uses :class:`~workers.trainer.optim.LeanAdamW`: bf16 moments,
    each parameter stepped during backward and its gradient freed, no global gradient clipping."""

    def __init__(self, model: nn.Module, config: GRPOConfig, ranks: Ranks, reference: nn.Module | None = None,
                 optimizer: str = "adamw", *, autocast: torch.dtype | None = None,
                 activation_checkpointing: bool = False, logits_chunk: int = DEFAULT_LOGITS_CHUNK) -> None:
        self.model = model
        self.config = config
        self.ranks = ranks
        # One CUDA rank: forward under bf16 autocast. Its weight cache stays off: cached casts of every weight
        # would live until the forward ends (a second bf16 model), uncached ones only until their layer's backward.
        self.autocast = autocast
        self.logits_chunk = logits_chunk
        if activation_checkpointing:  # keep only each decoder layer's input; recompute the layer in backward
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is None:
                raise ConfigError(f"activation checkpointing needs a transformers model, not {type(model).__name__}")
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.reference = reference if config.kl_coef > 0 else None
        self.lean: LeanAdamW | None = None
        if optimizer == "adamw-bf16":
            if ranks.sharded:
                raise ConfigError("--optimizer adamw-bf16 steps parameters during backward: one rank only")
            self.lean = LeanAdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                  betas=(0.9, 0.99))
            self.lean.step_in_backward()
            self.optimizer: torch.optim.Optimizer = self.lean
        elif optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                               betas=(0.9, 0.99))
        else:
            raise ConfigError(f"unknown optimizer {optimizer!r}")

    def _slice(self, samples: Sequence[Sample]) -> tuple[slice, float]:
        """This rank's samples and whether they count: a rank left without samples (batch smaller than the
        world) still runs forward/backward on one sample with weight 0, because FSDP's collectives need
        every rank."""
        start, stop = even_rows(len(samples), self.ranks.rank, self.ranks.world)
        if stop > start:
            return slice(start, stop), 1.0
        return slice(0, 1), 0.0

    def step(self, samples: Sequence[Sample]) -> StepStats:
        """One GRPO update on ``samples`` (the whole batch, identical on every rank). Statistics are the
        whole batch's on rank 0 (gathered from the ranks' slices) and this rank's slice elsewhere."""
        if not samples:
            raise ValueError("a GRPO step needs at least one sample")
        advantages = torch.tensor(group_advantages(samples), dtype=torch.float32)
        total_tokens = max(sum(len(s.completion_ids) for s in samples), 1)
        where, weight = self._slice(samples)
        mine = list(samples[where])
        old = torch.zeros((len(mine), max(len(s.completion_ids) for s in mine)))
        for i, s in enumerate(mine):
            old[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        device = _local(next(self.model.parameters())).device  # the step runs where the model lives
        adv, old = advantages[where].to(device), old.to(device)
        ref = None
        if self.reference is not None:  # every rank runs it (FSDP collectives), on its own slice
            with torch.no_grad(), self._compute(device):
                ref, _ = token_logprobs(self.reference, mine, chunk=self.logits_chunk)
        self.model.train()
        aux_coef = router_aux_coef(self.model)
        for _ in range(self.config.epochs):
            with self._compute(device):
                new, mask, aux = policy_logprobs(self.model, mine, chunk=self.logits_chunk)
            local_loss, extra = grpo_loss(new, old, mask, adv, self.config.clip_eps, ref, self.config.kl_coef)
            if aux is not None and aux_coef:
                # MoE: the router's load-balancing loss of this rank's slice, as transformers adds it; scaled
                # with the surrogate below, so over ranks it is the token-weighted mean of the slices' losses.
                local_loss = local_loss + aux_coef * aux.to(local_loss.device)
            local_tokens = float(mask.sum().clamp(min=1))
            scale = weight * (local_tokens / total_tokens) * self.ranks.world
            loss = local_loss if scale == 1.0 else local_loss * scale
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # the lean optimizer has stepped (and freed) every gradient by now
            if self.lean is None:
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
                self.optimizer.step()
                # Free the gradients now: alive, they would sit beside the next epoch's activations and through
                # checkpoint and publish (4 B per parameter for nothing).
                self.optimizer.zero_grad(set_to_none=True)
            else:
                lean_norm = self.lean.take_grad_norm()  # this epoch's, measured before each update
        self.model.eval()
        grad_norm = lean_norm if self.lean is not None else _full(norm)
        tokens = int(mask.sum()) if weight else 0
        local = {"loss": float(local_loss.detach()) * tokens, "tokens": tokens,
                 **{k: v * tokens for k, v in extra.items()}}
        stats = self._combine(local)
        return StepStats(loss=stats["loss"], mean_reward=sum(s.reward for s in samples) / len(samples),
                         mean_advantage_abs=float(advantages.abs().mean()), clip_fraction=stats["clip_fraction"],
                         kl=stats["kl"], approx_kl_behaviour=stats["approx_kl_behaviour"], grad_norm=grad_norm,
                         tokens=int(stats["tokens"]), samples=len(samples))

    def _compute(self, device: torch.device) -> contextlib.AbstractContextManager[object]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast, cache_enabled=False)

    def _combine(self, local: dict[str, float]) -> dict[str, float]:
        """Token-weighted means over the ranks' slices (rank 0); per-slice means elsewhere."""
        gathered = self.ranks.gather(local, "stats") or [local]
        tokens = sum(g["tokens"] for g in gathered)
        out = {k: sum(g[k] for g in gathered) / max(tokens, 1) for k in local if k != "tokens"}
        out["tokens"] = tokens
        return out


def _local(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def _full(norm: torch.Tensor) -> float:
    """The gradient norm as a float (a DTensor's is reduced across ranks first: one scalar, not a weight)."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
