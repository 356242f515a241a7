"""Same bytes out: the segments, digests and staged bits the codec produces on the scale benchmark's
generated versions are pinned to what the codec produced before its host kernels were rewritten.

The pinned SHA-256 values were computed by the previous numpy implementation (commit cb0a1b3) on exactly these
inputs; any change to the wire format, the digest or the decoded bits changes them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from aurora_store.codec import CodecParams, DeltaEncoder, DeltaManifest, ModelLayout, TensorTarget, kernels, stage
from aurora_store.codec.digest import digest_state, hash_elements, hash_range
from aurora_store.codec.encoder import pieces_from_states
from benchmarks import scale

# SHA-256 over (every segment's bytes, in order) + the digests; see _fingerprint.
PINNED = {
    "tiny-a": "df92d11b76731df0c1372dd2f6c39df2251b21a90fb329351d7020ae29fc19ad",
    "tiny-b": "f3f7c8c05982718dce160c7174ac9bfc3cf077b29c19c9a7045f3123d16030ea",
}


def _versions(tmp_path: Path, name: str) -> tuple[ModelLayout, dict, dict, str]:
    config = scale.TINY[name]
    spec = {"config": config, "workdir": str(tmp_path), "lr": 1e-6, "warmup": 2, "seed": 0}
    gen = scale._role_generate(spec)
    layout = ModelLayout.from_config(config)
    old = scale._open_version(tmp_path, layout, "old", in_memory=True)
    new = scale._open_version(tmp_path, layout, "new", in_memory=True)
    return layout, old, new, gen["old_digest"]


PARAMS = CodecParams(segment_bytes=4096)  # small segments and chunks: many of both on a few-MB model


def _fingerprint(layout: ModelLayout, old: dict, new: dict, threads: int | None = None) -> tuple[str, list, str]:
    h = hashlib.sha256()
    plain = DeltaEncoder(layout, CodecParams(segment_bytes=4096, entropy="none"), encode_threads=threads)
    for segment in plain.segments(pieces_from_states(layout, old, new)):
        h.update(segment.data)
    encoder = DeltaEncoder(layout, PARAMS, encode_threads=threads)
    segments = list(encoder.segments(pieces_from_states(layout, old, new)))
    for segment in segments:
        h.update(segment.data)
    base, after = digest_state(layout, old), digest_state(layout, new)
    h.update(str(base).encode() + str(after).encode() + str(encoder.summary.digest_delta).encode())
    return h.hexdigest(), segments, str(base + encoder.summary.digest_delta)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_segments_and_digests_are_byte_identical_to_the_previous_codec(tmp_path, monkeypatch, name):
    layout, old, new, old_digest = _versions(tmp_path, name)
    fingerprint, segments, new_digest = _fingerprint(layout, old, new)
    assert fingerprint == PINNED[name]
    assert str(digest_state(layout, old)) == old_digest  # the generator's running digest: the same sums
    assert new_digest == str(digest_state(layout, new))
    assert len(segments) >= 3
    assert _fingerprint(layout, old, new, threads=2)[0] == fingerprint
    # Small blocks: every piece is many blocks, streamed over three threads several pieces ahead.
    monkeypatch.setattr(kernels, "BLOCK", 1 << 12)
    assert _fingerprint(layout, old, new, threads=3)[0] == fingerprint
    monkeypatch.undo()
    # Staging the pinned segments lands exactly on the new version.
    encoder_changed = {}
    for s in segments:
        for c in s.ref.chunks:
            encoder_changed[c.tensor] = encoder_changed.get(c.tensor, 0) + c.count
    manifest = DeltaManifest(version=1, base_version=0, layout_fingerprint=layout.fingerprint,
                             codec=PARAMS, segments=tuple(s.ref for s in segments),
                             changed=encoder_changed, elements=layout.numel, base_weights_digest=old_digest,
                             weights_digest=new_digest)
    target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0)
    staged = stage(manifest, {s.ref.digest: s.data for s in segments}, target, threads=1)
    spread = stage(manifest, [(s.ref, s.data) for s in reversed(segments)], target, threads=3)
    assert [(u.tensor, u.indices.tolist(), u.bits.tolist()) for u in staged.updates] == \
        [(u.tensor, u.indices.tolist(), u.bits.tolist()) for u in spread.updates]
    for update in staged.updates:
        t = layout[update.tensor]
        fused_new = torch.cat([new[c.train_name].reshape(-1) for c in t.components]).view(torch.int16)
        assert torch.equal(update.bits, fused_new[update.indices])


def test_digest_of_odd_offsets_and_bit_patterns_is_pinned():
    rng = np.random.default_rng(7)
    bits = rng.integers(-(1 << 15), 1 << 15, size=100_003, dtype=np.int16)
    bits[:8] = [0, -1, 0x7F80, -0x80, 0x7FC0, 1, -32768, 32767]  # zero, -0, inf, -inf, NaN, extremes
    idx = np.sort(rng.choice(1 << 40, size=bits.size, replace=False)).astype(np.int64)
    got = [str(hash_range("model.layers.0.mlp.up_proj.weight", off, bits)) for off in (0, 1, (1 << 33) + 5)]
    got.append(str(hash_elements("lm_head.weight", idx, bits)))
    got.append(str(hash_range("e", 0, bits[:0])))
    pinned = "9fc5f02402c793d8c59f64500387e1d4cf2d311292feefd1d081b89c74cc6600"
    assert hashlib.sha256(" ".join(got).encode()).hexdigest() == pinned
