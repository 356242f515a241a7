"""Compile the host kernels before anything is timed or waits on them.

numba compiles :mod:`.kernels` on first use and caches the machine code on disk beside the package; until that
cache exists (a fresh checkout, a new numba), the first encode, digest or staging in a process pays seconds of
compilation, on two busy cores 5–7 s. :func:`warm_kernels` pays it up front with one tiny round trip through
the host paths a publisher and a follower into host tensors take (digest, encode, stage on one and on two
threads, decode-ahead of prefetched segments, activate): later processes load the cached code in about 0.3 s.
Decode-ahead gathers and decodes from read-only segment bytes, which numba compiles as signatures of their own
(~1 s quiet): left cold, a cut-through follower paid them on its first prefetched version, on the critical
path. (Staging into an engine's own weights uses a few more kernels, compiled on their first use.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aurora_store.codec.ahead import AheadStager
from aurora_store.codec.decoder import activate, stage
from aurora_store.codec.digest import digest_state
from aurora_store.codec.encoder import DeltaEncoder, pieces_from_states
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.target import TensorTarget

#: A few-thousand-parameter model of the commonest family: every kernel the host paths call, on every dtype.
_TINY = {"model_type": "qwen3", "vocab_size": 64, "head_dim": 8, "hidden_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "tie_word_embeddings": True}


def warm_kernels(threads: Sequence[int] = (1, 2)) -> None:
    """Compile (or load from the on-disk cache) the kernels of the host publish and follow paths, in this
    process, running each path on each of ``threads`` thread counts. ``threads=(1,)`` compiles the same
    kernels and starts no thread: what a process about to fork wants (a pool's threads would not exist in its
    children)."""
    if not threads or min(threads) < 1:
        raise ValueError(f"threads must be thread counts of at least 1, not {tuple(threads)}")
    layout = ModelLayout.from_config(_TINY)
    generator = torch.Generator().manual_seed(0)
    old = {c.train_name: torch.randn(t.component_shape(c), generator=generator).to(torch.bfloat16)
           for t in layout.tensors for c in t.components}
    # every 7th element one ulp up: gaps and values of both signs, several chunks and segments
    new = {name: (bits.view(torch.int16) + (torch.arange(bits.numel()).reshape(bits.shape) % 7 == 0)
                  .to(torch.int16)).view(torch.bfloat16) for name, bits in old.items()}
    params = CodecParams(segment_bytes=4096)
    before = digest_state(layout, old, threads=max(threads))
    after = digest_state(layout, new, threads=min(threads))
    for count in threads:
        encoder = DeltaEncoder(layout, params, encode_threads=count)
        segments = list(encoder.segments(pieces_from_states(layout, old, new)))
        manifest = DeltaManifest(version=1, base_version=0, layout_fingerprint=layout.fingerprint, codec=params,
                                 segments=tuple(s.ref for s in segments), changed=dict(encoder.summary.changed),
                                 elements=layout.numel, base_weights_digest=str(before), weights_digest=str(after))
        target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0, digest=before)
        activate(stage(manifest, [(s.ref, s.data) for s in segments], target, threads=count), target)
    # decode-ahead, as a prefetching follower runs it: each segment as it arrives, named by a segment event
    # (digest and size only), then the manifest's check
    target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0, digest=before)
    ahead = AheadStager(target, params)
    for segment in segments:
        ahead.add(SegmentRef(segment.ref.digest, segment.ref.size, ()), segment.data)
    activate(ahead.finish(manifest), target)
