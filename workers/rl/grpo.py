"""GRPO: group-relative advantages and the clipped policy-ratio loss (optional KL to a reference policy).

The behaviour log-probabilities come from the actors (recorded while sampling, on the published bf16
policy that generated the rollout); the trainer recomputes them under its fp32 master weights. With
one-step asynchrony the behaviour policy is one version behind the weights being updated — the ratio
corrects for that, and the clip bounds the step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Sample:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    old_logprobs: tuple[float, ...]  # one per completion token, from the behaviour policy
    reward: float
    group: str  # prompt id: advantages are relative within a group


@dataclass(frozen=True)
class GRPOConfig:
    lr: float = 1e-3
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    epochs: int = 1  # optimizer updates per batch of rollouts (the clip keeps later ones close)


@dataclass(frozen=True)
class StepStats:
    loss: float
    mean_reward: float
    mean_advantage_abs: float
    clip_fraction: float
    kl: float
    approx_kl_behaviour: float
    grad_norm: float
    tokens: int
    samples: int


def group_advantages(samples: Sequence[Sample]) -> list[float]:
    """``(r − mean_group) / (std_group + ε)``; zero for groups whose rewards are all equal."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s.reward)
    stats = {}
    for key, rewards in groups.items():
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        stats[key] = (mean, std)
    return [0.0 if stats[s.group][1] < 1e-8 else (s.reward - stats[s.group][0]) / (stats[s.group][1] + 1e-6)
            for s in samples]


#: Completion tokens whose logits exist at once in :func:`token_logprobs` (``[rows, vocab]`` in fp32: at Qwen3's
#: 151936-token vocabulary 2048 rows are ~1.2 GB, where a 32k-token batch's full logits would be ~20 GB).
DEFAULT_LOGITS_CHUNK = 2048


def token_logprobs(model, samples: Sequence[Sample], pad_id: int = 0,
                   chunk: int = DEFAULT_LOGITS_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of each completion token under ``model``: ``[n, T]`` plus a ``[n, T]`` mask
    (:func:`policy_logprobs` without the router's loss)."""
    new, mask, _ = policy_logprobs(model, samples, pad_id, chunk)
    return new, mask


def router_aux_coef(model) -> float:
    """The weight of a mixture-of-experts model's load-balancing loss in its training loss, as transformers
    applies it (``router_aux_loss_coef`` when ``output_router_logits``); 0 for dense models."""
    config = getattr(model, "config", None)
    if not getattr(config, "output_router_logits", False):
        return 0.0
    return float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)


def policy_logprobs(model, samples: Sequence[Sample], pad_id: int = 0, chunk: int = DEFAULT_LOGITS_CHUNK
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of each completion token under ``model``: ``[n, T]`` plus a ``[n, T]`` mask, and
    the router's load-balancing loss of the same forward (transformers' ``aux_loss``, computed over the
    non-padding tokens) when the model is a mixture of experts configured with ``output_router_logits``.

    With ``chunk > 0`` the model's output head is applied only to the completion positions, ``chunk`` rows at a
    time, through :class:`ChunkedTokenLogprob` (log-softmax as ``logit[target] − logsumexp``, recomputed per
    chunk in backward), so neither the ``[n, L, vocab]`` logits nor their ``log_softmax`` ever exist. ``chunk=0``
    computes the full logits (the reference the chunked path is tested against)."""
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    width = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), longest), dtype=torch.long)
    which: list[int] = []
    where: list[int] = []
    targets: list[int] = []
    for i, s in enumerate(samples):  # right padding keeps positions of prompt + completion natural
        seq = list(s.prompt_ids) + list(s.completion_ids)
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        p, c = len(s.prompt_ids), len(s.completion_ids)
        which += [i] * c
        where += range(p - 1, p - 1 + c)  # logits at t predict token t + 1
        targets += s.completion_ids
    device = _param_device(model)  # inputs go where the model lives (CPU or a GPU)
    rows, cols = torch.tensor(which, dtype=torch.long, device=device), torch.tensor(
        [t - (p - 1) for t, p in zip(where, (len(samples[i].prompt_ids) for i in which), strict=True)],
        dtype=torch.long, device=device)
    out = torch.zeros((len(samples), width), device=device)
    mask = torch.zeros((len(samples), width), device=device)
    mask[rows, cols] = 1
    inputs = {"input_ids": ids.to(device), "attention_mask": attention.to(device), "use_cache": False}
    positions = torch.tensor(where, dtype=torch.long, device=device)
    target_ids = torch.tensor(targets, dtype=torch.long, device=device)
    if chunk:
        head = model.get_output_embeddings()
        flat = rows * longest + positions

        def scored(hidden: torch.Tensor) -> torch.Tensor:
            # Runs inside the model's forward, so under FSDP2 ``head.weight`` is the all-gathered parameter.
            picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)
            return ChunkedTokenLogprob.apply(picked, head.weight, target_ids, chunk)

        head.forward = scored  # the instance attribute shadows the class's forward for this one call
        try:
            output = model(**inputs)
            values = output.logits
        finally:
            del head.forward
    else:
        output = model(**inputs)
        values = F.log_softmax(output.logits.float(), dim=-1)[rows, positions, target_ids]
    out = out.index_put((rows, cols), values.float())
    return out, mask, getattr(output, "aux_loss", None)


class ChunkedTokenLogprob(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T)[r, targets[r]]`` for rows ``hidden [R, H]``, ``chunk`` rows at a time.

    Forward keeps only each row's logsumexp; backward recomputes each chunk's logits and uses
    ``∂/∂logits = g · (onehot(target) − softmax)``. Logits are computed in the matmul dtype autocast (or the
    inputs) choose, then reduced in fp32, as the full path does."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        kind = hidden.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
            torch.promote_types(hidden.dtype, weight.dtype)
        acc = torch.promote_types(torch.float32, dtype)  # reductions in fp32 (fp64 for fp64 inputs)
        with torch.autocast(kind, enabled=False):
            w = weight.to(dtype)
            out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
            lse = torch.empty_like(out)
            for lo in range(0, hidden.shape[0], chunk):
                logits = F.linear(hidden[lo:lo + chunk].to(dtype), w).to(acc)
                lse[lo:lo + chunk] = torch.logsumexp(logits, dim=-1)
                out[lo:lo + chunk] = logits.gather(1, targets[lo:lo + chunk, None]).squeeze(1) - lse[lo:lo + chunk]
                del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk, ctx.dtype = chunk, dtype
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        chunk, dtype = ctx.chunk, ctx.dtype
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        acc = lse.dtype
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if ctx.needs_input_grad[1] else None
        for lo in range(0, hidden.shape[0], chunk):
            h = hidden[lo:lo + chunk].to(dtype)
            g_out = grad_out[lo:lo + chunk].to(acc)
            grad = F.linear(h, w).to(acc).sub_(lse[lo:lo + chunk, None]).exp_().mul_(-g_out[:, None])
            grad.scatter_add_(1, targets[lo:lo + chunk, None], g_out[:, None])
            grad = grad.to(dtype)
            if grad_hidden is not None:
                grad_hidden[lo:lo + chunk] = grad @ w
            if grad_weight is not None:
                grad_weight.addmm_(grad.t().to(acc), h.to(acc))  # accumulated in fp32, no [V, H] temporary
            del grad
        return (grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None, None, None)


def _param_device(model) -> torch.device:
    param = next(model.parameters())
    local = param.to_local() if hasattr(param, "to_local") else param  # an FSDP2 DTensor's own shard
    return local.device


def grpo_loss(new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, clip_eps: float,
              ref: torch.Tensor | None = None, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean clipped surrogate; ``k3`` KL estimate to ``ref`` when ``kl_coef > 0``."""
    ratio = torch.exp(new - old)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(new)
    if ref is not None and kl_coef > 0:
        log_ratio_ref = ref - new
        kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
        per_token = per_token + kl_coef * kl
    tokens = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        clip_fraction = (((ratio - 1).abs() > clip_eps).float() * mask).sum() / tokens
        approx_kl = (((old - new)) * mask).sum() / tokens
        mean_kl = (kl * mask).sum() / tokens
    return loss, {"clip_fraction": float(clip_fraction), "approx_kl_behaviour": float(approx_kl),
                  "kl": float(mean_kl)}


class GRPOLearner:
    """fp32 master weights + AdamW; one optimizer step per batch of rollouts."""

    def __init__(self, model, config: GRPOConfig, reference=None) -> None:
        self.model = model
        self.config = config
        self.reference = reference
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                           betas=(0.9, 0.99))

    def step(self, samples: Sequence[Sample]) -> StepStats:
        advantages = torch.tensor(group_advantages(samples), dtype=torch.float32)
        old = torch.zeros((len(samples), max(len(s.completion_ids) for s in samples)))
        for i, s in enumerate(samples):
            old[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        ref = None
        if self.reference is not None and self.config.kl_coef > 0:
            with torch.no_grad():
                ref, _ = token_logprobs(self.reference, samples)
        self.model.train()
        aux_coef = router_aux_coef(self.model)
        for _ in range(self.config.epochs):
            new, mask, aux = policy_logprobs(self.model, samples)
            loss, extra = grpo_loss(new, old, mask, advantages, self.config.clip_eps, ref, self.config.kl_coef)
            if aux is not None and aux_coef:
                loss = loss + aux_coef * aux  # the router's load balancing, as transformers adds it to its loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
        self.model.eval()
        return StepStats(loss=float(loss.detach()), mean_reward=sum(s.reward for s in samples) / len(samples),
                         mean_advantage_abs=float(advantages.abs().mean()), grad_norm=float(grad_norm),
                         tokens=int(mask.sum()), samples=len(samples), **extra)
