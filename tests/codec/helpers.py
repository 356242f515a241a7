"""Small builders shared by the codec tests."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from aurora_store.codec import (
    CodecParams,
    DeltaEncoder,
    DeltaManifest,
    ModelLayout,
    Segment,
    WeightTarget,
    pieces_from_states,
)

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


def encode(layout: ModelLayout, old, new, version: int, base: int, base_digest,
           params: CodecParams | None = None) -> tuple[DeltaManifest, list[Segment]]:
    encoder = DeltaEncoder(layout, params or CodecParams(segment_bytes=4096))
    segments = list(encoder.segments(pieces_from_states(layout, old, new)))
    summary = encoder.summary
    manifest = DeltaManifest(
        version=version, base_version=base, layout_fingerprint=layout.fingerprint, codec=encoder.params,
        segments=tuple(s.ref for s in segments), changed=summary.changed, elements=layout.numel,
        base_weights_digest=str(base_digest), weights_digest=str(base_digest + summary.digest_delta))
    return manifest, segments


def target_for(layout: ModelLayout, state, version: int) -> WeightTarget:
    return WeightTarget.from_state(layout, {k: v.clone() for k, v in state.items()}, version=version)


def blobs(segments: list[Segment]) -> dict[str, bytes]:
    return {s.ref.digest: s.data for s in segments}
