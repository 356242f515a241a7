"""Lossless sparse bf16 delta checkpoints in the inference engine's fused layout."""

from aurora_store.codec.decoder import Staged, StagedDelta, StagedSnapshot, activate, apply_delta, decode_segment, stage
from aurora_store.codec.digest import WeightsDigest, digest_fused, digest_state
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

__all__ = [
    "ChunkRef", "CodecParams", "Component", "DeltaEncoder", "DeltaManifest", "EncodeSummary",
    "InferenceTensor", "ModelLayout", "Piece", "Segment", "SegmentRef", "Staged", "StagedDelta", "StagedSnapshot",
    "SupportsScatterPlan", "TensorTarget", "WeightTarget",
    "WeightsDigest", "activate", "apply_delta", "bits_view", "decode_segment", "digest_fused",
    "digest_state", "pieces_from_fused", "pieces_from_states", "stage",
]
