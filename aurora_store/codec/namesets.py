"""One model's weights under two name sets: what a trainer holds and what a snapshot's files hold.

A layout maps the engine's tensors to training tensors of one name set
(:data:`~aurora_store.codec.families.NAME_SETS`). For most families the trainer's in-memory names are also
what an engine loads from a directory; for some they are not (vLLM's DeepSeek loader reads routed experts only
per expert, ``experts.N.gate_proj.weight``, where transformers 5 holds one 3-D tensor per projection). The two
layouts then share every engine tensor and differ only in how some are cut into training tensors, so a state
moves from one name set to the other tensor by tensor through the engine's order — the digest, which is over
engine tensors, is the same under both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aurora_store.codec.families import snapshot_names
from aurora_store.codec.layout import ModelLayout
from aurora_store.errors import LayoutError, LayoutMismatchError


def snapshot_layout(config: Mapping[str, Any], dtype: str = "bfloat16") -> ModelLayout:
    """The layout whose training names a snapshot of this model's weights holds (its family's
    ``snapshot_names``): the names the engine's loader reads."""
    return ModelLayout.from_config(config, dtype, names=snapshot_names(config))


def check_same_engine(a: ModelLayout, b: ModelLayout) -> None:
    """Raise :class:`~aurora_store.errors.LayoutMismatchError` unless ``a`` and ``b`` are two name sets of one
    model: the same engine tensors (names, shapes, dtypes, in order) and the same engine-only tensors."""
    if [(t.name, t.shape, t.dtype) for t in a.tensors] != [(t.name, t.shape, t.dtype) for t in b.tensors] \
            or a.engine_only != b.engine_only:
        raise LayoutMismatchError(f"layouts {a.fingerprint} and {b.fingerprint} are not one model's engine tensors")


def convert(state: Mapping[str, torch.Tensor], source: ModelLayout, dest: ModelLayout) -> dict[str, torch.Tensor]:
    """``state`` (training names of ``source``) under ``dest``'s names; it may hold part of the model. A tensor
    cut the same way in both passes through as it is (the same tensor objects); another must be given whole
    (all of its training tensors or none), and is joined in the engine's order (one copy) and cut into
    ``dest``'s training tensors (views of that copy)."""
    check_same_engine(source, dest)
    out: dict[str, torch.Tensor] = {}
    for have, want in zip(source.tensors, dest.tensors):
        if have.components == want.components:
            out.update((c.train_name, state[c.train_name]) for c in have.components if c.train_name in state)
            continue
        present = [c.train_name in state for c in have.components]
        if not any(present):
            continue
        if not all(present):
            missing = [c.train_name for c in have.components if c.train_name not in state]
            raise LayoutError(f"{have.name}: only part of its training tensors are given (missing {missing[:4]})")
        for comp in have.components:
            got = tuple(state[comp.train_name].shape)
            if got != have.component_shape(comp):
                raise LayoutError(f"{comp.train_name}: shape {got} != {have.component_shape(comp)}")
        out.update(want.parts(have.join(state)))
    return out
