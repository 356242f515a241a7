"""A layout proven against the engine that loads it: every engine parameter made by exactly one layout tensor,
every element bit-identical to what the layout builds from the trainer's tensors, nothing left on either side.

:func:`prove_layout` compares a layout, a trainer-side state (training names) and the parameters an engine
holds after loading the same weights (vLLM's, read back right after its own loaders ran). The only difference
it allows is the one engines make on purpose: vocabulary-parallel tensors (``embed_tokens``, ``lm_head``) padded
with extra rows, which are never addressed. The engine parameters the layout declares engine-only (constants, and
tensors the engine derives after loading) must exist in the engine and are not counted as left over; their values
are checked by whoever knows the engine's rule (``tests/vllm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from aurora_store.codec.layout import DTYPES, ModelLayout, bits_view
from aurora_store.errors import LayoutError

#: Engine tensors whose rows an engine may pad (vLLM pads the vocabulary to a multiple of 64 per rank).
PADDED_LEAVES = ("embed_tokens", "embedding", "lm_head")


@dataclass(frozen=True)
class LayoutProof:
    """What :func:`prove_layout` found: elements compared bit for bit, and every problem (none = proven)."""

    compared: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def prove_layout(layout: ModelLayout, state: Mapping[str, torch.Tensor],
                 engine: Mapping[str, torch.Tensor]) -> LayoutProof:
    """Check ``layout`` fed with ``state`` (training names) against ``engine``'s parameters (its names)."""
    problems: list[str] = []
    try:
        layout.check_state(state)  # every training tensor used exactly once, nothing left over
    except LayoutError as exc:
        problems.append(f"trainer side: {exc}")
        return LayoutProof(0, tuple(problems))
    declared = {e.name for e in layout.engine_only}
    problems += [f"engine parameter {n} is not in the layout" for n in engine if n not in layout and n not in declared]
    problems += [f"engine-only tensor {n} is not an engine parameter" for n in sorted(declared) if n not in engine]
    problems += [f"layout tensor {t.name} is not an engine parameter" for t in layout.tensors if t.name not in engine]
    fused = layout.fuse(state)
    compared = 0
    for tensor in layout.tensors:
        got = engine.get(tensor.name)
        if got is None:
            continue
        if got.dtype != DTYPES[tensor.dtype]:
            problems.append(f"{tensor.name}: engine dtype {got.dtype}, layout {tensor.dtype}")
            continue
        want = fused[tensor.name]
        shape = tuple(got.shape)
        padded = (tensor.name.split(".")[-2] in PADDED_LEAVES and len(shape) == len(tensor.shape)
                  and shape[1:] == tensor.shape[1:] and shape[0] >= tensor.shape[0])
        if shape != tensor.shape and not padded:
            problems.append(f"{tensor.name}: engine shape {shape}, layout {tensor.shape}")
            continue
        got = got[: tensor.shape[0]]
        mismatched = int((bits_view(got) != bits_view(want)).sum())
        if mismatched:
            problems.append(f"{tensor.name}: {mismatched} of {tensor.numel} elements differ from the engine's")
        compared += tensor.numel
    return LayoutProof(compared, tuple(problems))
