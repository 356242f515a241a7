"""The mixture-of-experts size of the scale benchmark (``python -m benchmarks scale --sizes qwen3-moe-1b``).

A Qwen3-MoE step differs from a dense one in *which* weights get a gradient: the router sends each token to
``k`` of ``E`` experts, so an expert that no token of the step reached has a zero gradient. AdamW still moves
it — its first moment, decayed by β₁, carries the earlier steps' gradients — so its weights change less often
in bf16 than a touched expert's, but not never. The generator models that: at every Adam step a fixed fraction
(:data:`TOUCHED_FRACTION`) of each layer's experts, drawn afresh, gets a gradient; the others get zero. The
output splits the measured step's density between attention, router, experts and the rest (embedding, norms),
and the experts' density between those that got a gradient at the step, those that got one only at earlier
steps (momentum alone) and those that never did, so the effect is a number, not a guess.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np
import torch

from aurora_store.codec.layout import ModelLayout

_QWEN3_MOE = {"model_type": "qwen3_moe", "vocab_size": 151936, "head_dim": 128, "tie_word_embeddings": True,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}
#: ~1.05 B parameters, 64 experts of which 8 are active per token (Qwen3-30B-A3B's ratio), 2 GiB per bf16 version:
#: the publisher's two versions fit a shared 2-core, 23 GiB machine.
MOE_SIZES: dict[str, dict[str, Any]] = {
    "qwen3-moe-1b": {**_QWEN3_MOE, "hidden_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
                     "num_key_value_heads": 4, "intermediate_size": 3072, "num_experts": 64,
                     "num_experts_per_tok": 8, "moe_intermediate_size": 256},
}
#: A few-MB model of the same structure (the test's).
TINY_MOE: dict[str, dict[str, Any]] = {
    "tiny-moe": {**_QWEN3_MOE, "vocab_size": 2048, "head_dim": 32, "hidden_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 384, "num_experts": 8,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 64},
}
#: Share of each layer's experts that receive a gradient at a step (an RL step of a few thousand tokens over
#: 64 experts with an imbalanced router leaves many cold; the figure makes the untouched experts' share visible).
TOUCHED_FRACTION = 0.5

_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.")
GROUPS = ("attention", "router", "experts", "other")


def is_moe(config: dict[str, Any]) -> bool:
    return "num_experts" in config


def group_of(inference_name: str) -> str:
    """Which part of a decoder an engine tensor belongs to: attention, router, experts or other."""
    if ".self_attn." in inference_name:
        return "attention"
    if inference_name.endswith(".mlp.gate.weight"):
        return "router"
    if ".experts." in inference_name:
        return "experts"
    return "other"


def touched_experts(seed: int, layer: str, step: int, count: int, fraction: float = TOUCHED_FRACTION) -> np.ndarray:
    """Boolean ``[count]``: which of ``layer``'s experts get a gradient at Adam step ``step`` (deterministic)."""
    key = hashlib.sha256(f"{seed}:{layer}:touched:{step}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    chosen = rng.permutation(count)[: max(1, round(fraction * count))]
    mask = np.zeros(count, dtype=bool)
    mask[chosen] = True
    return mask


class ExpertGradients:
    """The generator's hook for one training tensor's chunk: a gradient mask per Adam step (None for tensors
    that are not experts) and, at the measured step, the changed elements of touched and untouched experts."""

    def __init__(self, config: dict[str, Any], seed: int) -> None:
        self.count = int(config["num_experts"]) if is_moe(config) else 0
        self.seed = seed
        #: [changed, elements] of experts that got a gradient at the measured step, of those that did not but
        #: did earlier (moving on momentum), and of those that never did (Adam leaves them exactly as they were).
        self.tally = {"touched": [0, 0], "momentum": [0, 0], "never": [0, 0]}

    def _experts(self, train: str, start: int, n: int, shape: tuple[int, ...]) -> tuple[str, torch.Tensor] | None:
        match = _EXPERTS.match(train)
        if not self.count or match is None or len(shape) != 3:
            return None
        slab = math.prod(shape[1:])
        return match.group(1), torch.arange(start, start + n, dtype=torch.int64) // slab

    def mask(self, train: str, start: int, n: int, shape: tuple[int, ...], step: int) -> torch.Tensor | None:
        found = self._experts(train, start, n, shape)
        if found is None:
            return None
        layer, expert = found
        return torch.from_numpy(touched_experts(self.seed, layer, step, self.count))[expert].float()

    def count_changed(self, train: str, start: int, shape: tuple[int, ...], step: int, old: torch.Tensor,
                      new: torch.Tensor) -> None:
        found = self._experts(train, start, old.numel(), shape)
        if found is None:
            return
        layer, expert = found
        touched = torch.from_numpy(touched_experts(self.seed, layer, step, self.count))[expert]
        before = np.zeros(self.count, dtype=bool)
        for earlier in range(1, step):
            before |= touched_experts(self.seed, layer, earlier, self.count)
        earlier_only = torch.from_numpy(before)[expert] & ~touched
        changed = old.view(torch.int16) != new.view(torch.int16)
        for name, where in (("touched", touched), ("momentum", earlier_only), ("never", ~touched & ~earlier_only)):
            self.tally[name][0] += int(changed[where].sum())
            self.tally[name][1] += int(where.sum())


def density_split(layout: ModelLayout, changed: dict[str, int], tally: dict[str, list[int]] | None) -> dict[str, Any]:
    """The measured step's density per part of the model (from the manifest's per-tensor counts) and the
    experts' split between those that got a gradient at that step and those that moved on momentum alone."""
    numel = dict.fromkeys(GROUPS, 0)
    hits = dict.fromkeys(GROUPS, 0)
    for tensor in layout.tensors:
        group = group_of(tensor.name)
        numel[group] += tensor.numel
        hits[group] += int(changed.get(tensor.name, 0))
    out: dict[str, Any] = {
        "density_by_part": {g: hits[g] / numel[g] for g in GROUPS if numel[g]},
        "params_by_part": {g: numel[g] for g in GROUPS if numel[g]},
        "changed_by_part": {g: hits[g] for g in GROUPS if numel[g]},
        "experts_touched_fraction": TOUCHED_FRACTION,
    }
    if tally is not None:
        for kind, (hit, total) in tally.items():
            out[f"expert_density_{kind}"] = hit / total if total else None
        out["expert_params_by_kind"] = {kind: total for kind, (_, total) in tally.items()}
    return out
