"""Lossless sparse bf16 delta checkpoints in the inference engine's fused layout.

The names below are imported on first use (PEP 562): importing one light module of this package (the digest
value, the JSON documents, the manifest) must not import torch and the compiled kernels, which cost a process
2–3 CPU-seconds to start — a relay or the CLI never needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "aurora_store.codec.decoder": ("Staged", "StagedDelta", "StagedSnapshot", "activate", "apply_delta",
                                   "decode_segment", "stage"),
    "aurora_store.codec.digest": ("digest_fused", "digest_state"),
    "aurora_store.codec.weights_digest": ("WeightsDigest",),
    "aurora_store.codec.encoder": ("DeltaEncoder", "EncodeSummary", "Piece", "Segment", "pieces_from_fused",
                                   "pieces_from_states"),
    "aurora_store.codec.layout": ("Component", "InferenceTensor", "ModelLayout", "bits_view"),
    "aurora_store.codec.manifest": ("ChunkRef", "DeltaManifest", "SegmentRef"),
    "aurora_store.codec.params": ("CodecParams",),
    "aurora_store.codec.target": ("SupportsScatterPlan", "TensorTarget", "WeightTarget"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["ChunkRef", "CodecParams", "Component", "DeltaEncoder", "DeltaManifest", "EncodeSummary",
    "InferenceTensor", "ModelLayout", "Piece", "Segment", "SegmentRef", "Staged", "StagedDelta", "StagedSnapshot",
    "SupportsScatterPlan", "TensorTarget", "WeightTarget", "WeightsDigest", "activate", "apply_delta", "bits_view",
    "decode_segment", "digest_fused", "digest_state", "pieces_from_fused", "pieces_from_states", "stage"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from aurora_store.codec.decoder import (
        Staged,
        StagedDelta,
        StagedSnapshot,
        activate,
        apply_delta,
        decode_segment,
        stage,
    )
    from aurora_store.codec.digest import digest_fused, digest_state
    from aurora_store.codec.encoder import (
        DeltaEncoder,
        EncodeSummary,
        Piece,
        Segment,
        pieces_from_fused,
        pieces_from_states,
    )
    from aurora_store.codec.layout import Component, InferenceTensor, ModelLayout, bits_view
    from aurora_store.codec.manifest import ChunkRef, DeltaManifest, SegmentRef
    from aurora_store.codec.params import CodecParams
    from aurora_store.codec.target import SupportsScatterPlan, TensorTarget, WeightTarget
    from aurora_store.codec.weights_digest import WeightsDigest
