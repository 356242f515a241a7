"""The device extraction path (torch ops where the weights live, sparse copy to the host, prefetch) gives
byte-identical segments, manifests and digests to the host reference path. Run here on CPU tensors: the
same functions run on CUDA tensors in ``scripts/device-check``."""

import numpy as np
import pytest
import torch

from aurora_store.codec import CodecParams, DeltaEncoder, ModelLayout, apply_delta, digest_state, pieces_from_states
from aurora_store.codec.digest import WeightsDigest, hash_elements, hash_range, lanes_on_device, range_lanes_on_device
from aurora_store.codec.encoder import Piece
from aurora_store.codec.extract import DeviceExtraction
from aurora_store.codec.sharding import rank_rows, row_pieces
from aurora_store.errors import LayoutError
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for
from benchmarks.synthetic import AdamSimulator

SPECIAL_BITS = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x0001, 0x8001]  # ±0, ±inf, NaNs…
UNTIED = {**TINY_QWEN3, "tie_word_embeddings": False, "num_hidden_layers": 3}


def _both(layout, old, new, params):
    host = encode(layout, old, new, 1, 0, digest_state(layout, old), params, extraction="host")
    device = encode(layout, old, new, 1, 0, digest_state(layout, old), params, extraction="device")
    return host, device


def _assert_identical(host, device):
    (m_host, s_host), (m_dev, s_dev) = host, device
    assert m_dev.to_bytes() == m_host.to_bytes()
    assert [s.data for s in s_dev] == [s.data for s in s_host]
    assert [s.ref for s in s_dev] == [s.ref for s in s_host]


@pytest.mark.parametrize("params", [CodecParams(segment_bytes=4096), CodecParams(segment_bytes=1 << 20, values="raw"),
                                    CodecParams(segment_bytes=4096, entropy="none")], ids=["delta16", "raw", "plain"])
def test_adam_step_delta_is_byte_identical_to_the_host_encoder(params):
    layout = ModelLayout.from_config(UNTIED)
    sim = AdamSimulator(layout, lr=1e-6, seed=3)
    sim.step()
    old = sim.published()
    sim.step()
    new = sim.published()
    host, device = _both(layout, old, new, params)
    _assert_identical(host, device)
    manifest, segments = device
    assert sum(manifest.changed.values()) > 0
    target = target_for(layout, old, version=0)
    apply_delta(manifest, blobs(segments), target)
    assert target.digest == digest_state(layout, new)


def test_special_bit_patterns_and_sparse_perturbations_match():
    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=5)
    new = perturb(old, fraction=0.05, seed=6)
    name = next(iter(new))
    bits = new[name].view(torch.int16).clone().reshape(-1)
    bits[: len(SPECIAL_BITS)] = torch.tensor(np.array(SPECIAL_BITS, dtype=np.uint16).view(np.int16))
    new[name] = bits.reshape(new[name].shape).view(torch.bfloat16)
    # -0.0 vs +0.0 and NaN vs the same NaN: compared as bits, not floats.
    _assert_identical(*_both(layout, old, new, CodecParams(segment_bytes=4096)))


def test_row_shards_of_two_ranks_encode_identically():
    layout = ModelLayout.from_config(UNTIED)
    old = random_state(layout, seed=7)
    new = perturb(old, fraction=0.02, seed=8)
    for rank in range(2):
        def rows(state, rank=rank):
            return rank_rows(layout, state, rank, 2)
        outs = []
        for extraction in ("host", "device"):
            encoder = DeltaEncoder(layout, CodecParams(segment_bytes=4096), extraction=extraction)
            data = [s.data for s in encoder.segments(row_pieces(layout, rows(old), rows(new)))]
            outs.append((data, encoder.summary.digest_delta, encoder.summary.changed, encoder.summary.elements))
        assert outs[0] == outs[1]


@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_chunk_encoding_is_byte_identical(threads):
    layout = ModelLayout.from_config(UNTIED)
    old = random_state(layout, seed=13)
    new = perturb(old, fraction=0.2, seed=14)
    params = CodecParams(segment_bytes=4096)  # many small chunks: threads finish out of order
    reference = DeltaEncoder(layout, params, extraction="host")
    expected = [s.data for s in reference.segments(pieces_from_states(layout, old, new))]
    encoder = DeltaEncoder(layout, params, extraction="device", encode_threads=threads)
    assert [s.data for s in encoder.segments(pieces_from_states(layout, old, new))] == expected
    assert len(expected) > 5
    for key in ("changed", "digest_delta", "index_bytes", "value_bytes", "segment_bytes", "segments", "elements"):
        assert getattr(encoder.summary, key) == getattr(reference.summary, key), key


def test_unchanged_weights_give_no_segments_and_a_zero_digest_delta():
    layout = ModelLayout.from_config(TINY_QWEN3)
    state = random_state(layout, seed=9)
    encoder = DeltaEncoder(layout, extraction="device")
    assert list(encoder.segments(Piece(t, o, b, b) for t, o, b in layout.pieces(state))) == []
    assert encoder.summary.digest_delta == WeightsDigest() and encoder.summary.elements == layout.numel


def test_prefetch_depth_does_not_change_the_output():
    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=11)
    new = perturb(old, fraction=0.1, seed=12)
    runs = []
    for depth in (0, 1, 3):
        pieces = [(p.tensor, p.offset, p.old, p.new) for p in
                  (Piece(t, o, a, b) for (t, o, b), (_, _, a) in zip(layout.pieces(new), layout.pieces(old)))]
        extraction = DeviceExtraction(pieces, prefetch=depth)
        changes = [(c.tensor.name, c.offset, c.indices.tolist(), c.old.tolist(), c.new.tolist()) for c in extraction]
        runs.append((changes, extraction.digest_delta()))
    assert runs[0] == runs[1] == runs[2]


def test_torch_digest_lanes_equal_the_numpy_digest():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-32768, 32767, (70001,), dtype=torch.int16, generator=gen)
    idx = torch.sort(torch.randperm(1 << 20, generator=gen)[: bits.numel()]).values * 61 + 5  # > 2**24: wide keys
    from aurora_store.codec.digest import digest_of_lanes
    assert digest_of_lanes(lanes_on_device("t", idx, bits)) == hash_elements("t", idx.numpy(), bits.numpy())
    assert digest_of_lanes(range_lanes_on_device("t", 1 << 33, bits)) == hash_range("t", 1 << 33, bits.numpy())


def test_meta_tensors_are_refused_with_a_typed_error():
    # 'meta' tensors hold no data, so nothing can be extracted from them: the encoder says so instead
    # of producing an empty (wrong) delta.
    layout = ModelLayout.from_config(TINY_QWEN3)
    tensor = layout.tensors[0]
    meta = torch.empty(tensor.numel, dtype=torch.int16, device="meta")
    with pytest.raises(LayoutError, match="meta"):
        list(DeltaEncoder(layout, extraction="device").segments([Piece(tensor, 0, meta, meta)]))
