"""Builders for tests of code that uses Aurora: tiny layouts, random bf16 states, perturbed versions,
encoded deltas, weight targets — and :func:`publish`, which goes through the production publish path."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from aurora_store.codec import (
    CodecParams,
    DeltaEncoder,
    DeltaManifest,
    ModelLayout,
    Segment,
    TensorTarget,
    WeightTarget,
    pieces_from_states,
)
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.store.publisher import PublishReport, VersionPublisher
from aurora_store.store.transfer import SegmentCallback
from aurora_store.store.versions import DeltaStore

TINY_QWEN3 = {
    "model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 128,
    "tie_word_embeddings": True,
}


def random_state(layout: ModelLayout, seed: int = 0, scale: float = 0.02) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for tensor in layout.tensors:
        for comp in tensor.components:
            shape = tensor.component_shape(comp)
            state[comp.train_name] = (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16)
    return state


def perturb(state: Mapping[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """Move a random ``fraction`` of elements by ±1 ulp (mostly) or to a random value (sometimes)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        bits = tensor.view(torch.int16).clone()
        mask = torch.rand(bits.shape, generator=gen) < fraction
        step = torch.randint(0, 2, bits.shape, generator=gen, dtype=torch.int16) * 2 - 1
        jump = torch.randint(-32768, 32767, bits.shape, generator=gen, dtype=torch.int16)
        wild = torch.rand(bits.shape, generator=gen) < 0.1
        bits = torch.where(mask & ~wild, bits + step, bits)
        bits = torch.where(mask & wild, jump, bits)
        out[name] = bits.view(torch.bfloat16)
    return out


def publish(store: DeltaStore, layout: ModelLayout, old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor],
            version: int, base_digest: WeightsDigest, params: CodecParams | None = None, *,
            streams: int | None = None, on_segment: SegmentCallback | None = None,
            record_history: bool = False) -> PublishReport:
    """Publish ``old → new`` as ``version`` (base ``version - 1``) through :class:`VersionPublisher`, exactly
    as the trainer does; small segments (4 KiB) by default so that tiny models still span several."""
    publisher = VersionPublisher(store, layout, params or CodecParams(segment_bytes=4096), streams,
                                 record_history=record_history)
    return publisher.publish(version, version - 1, base_digest, pieces_from_states(layout, old, new),
                             on_segment=on_segment)


def encode(layout: ModelLayout, old, new, version: int, base: int, base_digest,
           params: CodecParams | None = None, *, extraction: str = "auto") -> tuple[DeltaManifest, list[Segment]]:
    """A delta's manifest and segments in memory, with no store involved (for codec-level tests);
    ``extraction`` picks where changed elements are found (see :class:`DeltaEncoder`)."""
    encoder = DeltaEncoder(layout, params or CodecParams(segment_bytes=4096), extraction=extraction)
    segments = list(encoder.segments(pieces_from_states(layout, old, new)))
    summary = encoder.summary
    manifest = DeltaManifest(
        version=version, base_version=base, layout_fingerprint=layout.fingerprint, codec=encoder.params,
        segments=tuple(s.ref for s in segments), changed=summary.changed, elements=layout.numel,
        base_weights_digest=str(base_digest), weights_digest=str(base_digest + summary.digest_delta))
    return manifest, segments


def target_for(layout: ModelLayout, state, version: int) -> WeightTarget:
    return TensorTarget.from_state(layout, {k: v.clone() for k, v in state.items()}, version=version)


def blobs(segments: list[Segment]) -> dict[str, bytes]:
    return {s.ref.digest: s.data for s in segments}
