"""Staging against a host TensorTarget reads the old bits itself, chunk by chunk (the chunk's range picks its
piece; a chunk spanning pieces is cut at them). It must give exactly what the general path gives — a target
answering ``gather_many`` — for chunks inside one piece and across pieces, for both value transforms."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec import CodecParams, DeltaEncoder, DeltaManifest, ModelLayout, TensorTarget, activate, stage
from aurora_store.codec.encoder import pieces_from_fused
from aurora_store.codec.segment import unpack
from aurora_store.errors import DigestMismatchError
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state


class Elsewhere:
    """A target that is not a TensorTarget (as an engine in another process is): staging gathers for it."""

    def __init__(self, inner: TensorTarget) -> None:
        self._inner = inner
        self.layout, self.version, self.digest = inner.layout, inner.version, inner.digest

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@pytest.fixture(scope="module")
def case():
    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=3)
    new = perturb(old, fraction=0.05, seed=4)
    return layout, old, new


def _delta(layout, old, new, values: str):
    # Encoded from the fused tensors (one piece each), staged into the separate q/k/v and gate/up tensors: a
    # chunk covering a whole fused tensor spans the target's pieces.
    params = CodecParams(segment_bytes=1 << 20, values=values)
    base = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0).digest
    encoder = DeltaEncoder(layout, params)
    segments = list(encoder.segments(pieces_from_fused(layout, layout.fuse(old), layout.fuse(new))))
    s = encoder.summary
    manifest = DeltaManifest(version=1, base_version=0, layout_fingerprint=layout.fingerprint, codec=params,
                             segments=tuple(x.ref for x in segments), changed=s.changed, elements=layout.numel,
                             base_weights_digest=str(base), weights_digest=str(base + s.digest_delta))
    return manifest, {x.ref.digest: x.data for x in segments}


@pytest.mark.parametrize("values", ["delta16", "raw"])
def test_in_place_staging_equals_the_gathering_path_within_and_across_pieces(case, values):
    layout, old, new = case
    manifest, blobs = _delta(layout, old, new, values)
    target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0)
    starts = {t.name: [target.layout[t.name].component_span(c)[0] for c in t.components] for t in layout.tensors}
    headers = [h for data in blobs.values() for h, _, _ in unpack(data)]
    spanning = [h for h in headers if any(h.lo < s < h.hi for s in starts[h.tensor])]
    inside = [h for h in headers if not any(h.lo < s < h.hi for s in starts[h.tensor])]
    assert spanning and inside  # both branches of the in-place path are taken
    here = stage(manifest, blobs, target, threads=2)
    there = stage(manifest, blobs, Elsewhere(target), threads=1)
    assert [u.tensor for u in here.updates] == [u.tensor for u in there.updates]
    for a, b in zip(here.updates, there.updates):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.bits, b.bits), a.tensor
    activate(here, target)  # through the plan made while staging
    expected = TensorTarget.from_state(layout, new)
    assert target.digest == expected.full_digest() == target.full_digest()
    for t in layout.tensors:
        assert torch.equal(target.fused_bits(t.name), expected.fused_bits(t.name)), t.name


def test_in_place_staging_reads_the_target_it_is_given(case):
    """The old bits come from the target's own storage: a target whose weights differ (same declared digest)
    stages to a different digest and is refused."""
    layout, old, new = case
    manifest, blobs = _delta(layout, old, new, "delta16")
    weights = {k: v.clone() for k, v in old.items()}
    target = TensorTarget.from_state(layout, weights, version=0)
    fused = next(t for t in layout.tensors if len(t.components) > 1)
    weights[fused.components[-1].train_name].view(torch.int16).add_(1)  # drifted under a stale digest
    with pytest.raises(DigestMismatchError):
        stage(manifest, blobs, target)
