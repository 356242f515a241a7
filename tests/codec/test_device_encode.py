"""Encoding on the device (:mod:`aurora_store.codec.device_encode`): the raw streams built with torch ops are
byte for byte the host encoder's, so the segments, their refs, the changed counts and the digest move are too.

Run here on CPU tensors, which run the same torch code as a GPU (``tests/cuda`` runs these cases on CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aurora_store.codec import CodecParams, DeltaEncoder, ModelLayout, Piece, apply_delta, digest_state, kernels, leb128
from aurora_store.codec import extract as extract_module
from aurora_store.codec.device_encode import encode_changes
from aurora_store.codec.digest import WeightsDigest
from aurora_store.codec.segment import ValueTransform
from aurora_store.codec.sharding import rank_rows, row_pieces
from aurora_store.codec.values import encode_values
from aurora_store.testing.builders import blobs, encode, target_for

SMALL = CodecParams(segment_bytes=4096)  # chunks of at most 1365 changes
STEP = SMALL.max_changed_per_chunk
# ±0, ±inf, quiet and signalling NaNs with payloads, the smallest and largest subnormals, the extremes.
SPECIAL = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFC1, 0x7FFF, 0xFFFF, 0x0001,
                    0x8001, 0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F], dtype=np.uint16).view(np.int16)


def _bits(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int16))


def _encode(layout: ModelLayout, pieces: list[Piece], params: CodecParams, extraction: str, threads: int = 1):
    encoder = DeltaEncoder(layout, params, extraction=extraction, encode_threads=threads)
    segments = list(encoder.segments(pieces))
    s = encoder.summary
    return ([x.data for x in segments], [x.ref for x in segments], s.changed, s.digest_delta, s.elements,
            s.index_bytes, s.value_bytes)


def _assert_same(layout: ModelLayout, pieces: list[Piece], params: CodecParams = SMALL, threads: int = 1):
    host = _encode(layout, pieces, params, "host", threads)
    device = _encode(layout, pieces, params, "device", threads)
    assert device == host
    return host


def _one_tensor(old: np.ndarray, new: np.ndarray, name: str = "w") -> tuple[ModelLayout, list[Piece]]:
    layout = ModelLayout.identity({name: torch.zeros(old.size, dtype=torch.bfloat16)})
    return layout, [Piece(layout.tensors[0], 0, _bits(old), _bits(new))]


# --- the raw streams, against the format's reference encoders ------------------------------------------

@pytest.mark.parametrize("transform", [ValueTransform.DELTA16, ValueTransform.RAW])
@pytest.mark.parametrize("count", [1, 6, 7, 8, 21, 22])
def test_raw_streams_equal_the_reference_for_gaps_of_one_to_nine_bytes(transform, count):
    # Indices far apart need no tensor: gaps of 1 .. 2^56 + 63 (every LEB128 length, 1..9 bytes), cut every 7.
    rng = np.random.default_rng(count)
    bits = rng.permutation(np.resize(np.arange(0, 57, 7), count))
    gaps = (np.int64(1) << bits) + rng.integers(0, 64, size=count)
    idx = np.cumsum(gaps) - 1  # < 22 · 2^57 < 2^63
    numel = int(idx[-1]) + 1 + int(rng.integers(0, 5))
    if count >= 9:
        assert {len(leb128.encode(np.array([g]))) for g in gaps} == set(range(1, 10))
    old = rng.integers(-(1 << 15), 1 << 15, size=count).astype(np.int16)
    new = (old + rng.choice(np.array([1, -1, 2, -2, 3, 77, -32768], dtype=np.int16), size=count)).astype(np.int16)
    step = 7
    raw, spans = encode_changes(torch.from_numpy(idx), _bits(old), _bits(new), numel, step, transform)
    raw = raw.numpy()
    assert len(spans) == -(-count // step)
    for k, span in enumerate(spans):
        a, b = k * step, min((k + 1) * step, count)
        lo = 0 if a == 0 else int(idx[a])
        assert (span.lo, span.hi, span.count) == (lo, numel if b == count else int(idx[b]), b - a)
        index = raw[span.index_at: span.index_at + span.index_len].tobytes()
        assert index == leb128.encode(np.diff(idx[a:b], prepend=lo)) == kernels.leb128_gaps(idx[a:b], lo).tobytes()
        assert raw[span.value_at: span.value_at + span.value_len].tobytes() == encode_values(old[a:b], new[a:b],
                                                                                              transform)
    assert spans[-1].value_at + spans[-1].value_len == raw.size  # nothing but the streams


# --- whole segments, device path against the host encoder ----------------------------------------------

def value_class_pair() -> tuple[np.ndarray, np.ndarray, int]:
    """Old and new bits holding every 16-bit difference once (±1 ulp, w ∈ {3, 4}, every escape up to -32768)
    from random old bits, and every ordered pair of special patterns (NaN payloads, ±0, ±inf, subnormals),
    shuffled among unchanged elements; and the number of changes (65,535 + 272)."""
    rng = np.random.default_rng(1)
    diffs = np.arange(1, 1 << 16, dtype=np.int64).astype(np.uint16).view(np.int16)
    base = rng.integers(-(1 << 15), 1 << 15, size=diffs.size).astype(np.int16)
    pairs = np.array([(a, b) for a in SPECIAL for b in SPECIAL if a != b], dtype=np.int16)
    unchanged = rng.integers(-(1 << 15), 1 << 15, size=5000).astype(np.int16)  # zero runs between changes
    old = np.concatenate([base, pairs[:, 0], unchanged, SPECIAL])
    new = np.concatenate([base + diffs, pairs[:, 1], unchanged, SPECIAL])
    order = rng.permutation(old.size)
    return old[order], new[order], diffs.size + len(pairs)


def sparse_pair() -> tuple[np.ndarray, np.ndarray, int]:
    """2^22 elements with ~4,000 changes, clustered and sparse (gaps of 1 to 4 LEB128 bytes, changes on the
    edges of 2^16-element blocks), and the number of changes."""
    n = 1 << 22
    rng = np.random.default_rng(4)
    old = rng.integers(-(1 << 15), 1 << 15, size=n).astype(np.int16)
    new = old.copy()
    at = np.unique(np.concatenate([rng.choice(n // 8, size=3000, replace=False), [n - 1, n // 2, (1 << 16) - 1],
                                   [1 << 16], rng.choice(n, size=1000, replace=False)]))
    new[at] -= 1
    return old, new, at.size


def test_every_value_class_and_special_bit_pattern_is_byte_identical():
    old, new, changes = value_class_pair()
    layout, pieces = _one_tensor(old, new)
    for params in (SMALL, CodecParams(segment_bytes=1 << 20), CodecParams(segment_bytes=4096, values="raw"),
                   CodecParams(segment_bytes=4096, entropy="none")):
        changed = _assert_same(layout, pieces, params)[2]
        assert changed == {"w": changes}
    # And the device path's delta applies: the new bits exactly, by digest.
    before, after = {"w": pieces[0].old.view(torch.bfloat16)}, {"w": pieces[0].new.view(torch.bfloat16)}
    target = target_for(layout, before, version=0)
    manifest, segments = encode(layout, before, after, 1, 0, target.digest, SMALL, extraction="device")
    apply_delta(manifest, blobs(segments), target)
    assert target.digest == digest_state(layout, after)


@pytest.mark.parametrize("changes", [1, STEP - 1, STEP, STEP + 1, 2 * STEP, 2 * STEP + 1, 3 * STEP - 1])
def test_chunks_are_cut_where_the_host_cuts_them(changes):
    rng = np.random.default_rng(changes)
    old = rng.integers(-(1 << 15), 1 << 15, size=3 * STEP + 50).astype(np.int16)
    new = old.copy()
    at = np.sort(rng.choice(old.size, size=changes, replace=False))
    new[at] += rng.integers(1, 9, size=changes).astype(np.int16)
    layout, pieces = _one_tensor(old, new)
    _, refs, *_ = _assert_same(layout, pieces)
    chunks = [c for r in refs for c in r.chunks]
    assert [c.count for c in chunks] == [min(STEP, changes - k) for k in range(0, changes, STEP)]
    assert chunks[0].lo == 0 and chunks[-1].hi == old.size


def test_a_sparse_piece_larger_than_the_compare_block(monkeypatch):
    # Compared as one block, then in 64 blocks of 2^16 (many with no change: the count pass).
    old, new, changes = sparse_pair()
    layout, pieces = _one_tensor(old, new)
    whole = _assert_same(layout, pieces, threads=2)
    monkeypatch.setattr(extract_module, "MASK_BLOCK", 1 << 16)
    assert _encode(layout, pieces, SMALL, "device") == whole
    assert whole[2] == {"w": changes} and len({c.count for r in whole[1] for c in r.chunks}) > 1


def test_empty_deltas_and_pieces_without_changes():
    rng = np.random.default_rng(5)
    state = {name: _bits(rng.integers(-(1 << 15), 1 << 15, size=size)).view(torch.bfloat16)
             for name, size in (("a", 300), ("b", 5000), ("c", 1), ("d", 40))}
    layout = ModelLayout.identity(state)
    same = [Piece(t, 0, state[t.name].view(torch.int16), state[t.name].view(torch.int16)) for t in layout.tensors]
    assert _assert_same(layout, same) == ([], [], {}, WeightsDigest(), layout.numel, 0, 0)
    changed = {**state, "b": state["b"].clone()}
    changed["b"].view(torch.int16)[[0, 17, 4999]] += 1
    pieces = [Piece(t, 0, state[t.name].view(torch.int16), changed[t.name].view(torch.int16)) for t in layout.tensors]
    _, _, counts, digest, *_ = _assert_same(layout, pieces)
    assert counts == {"b": 3} and digest == digest_state(layout, changed) - digest_state(layout, state)


def test_two_rank_row_shards_are_byte_identical_per_rank():
    rng = np.random.default_rng(6)
    old = {"embed": rng.integers(-(1 << 15), 1 << 15, size=(700, 16)), "proj": rng.integers(-(1 << 15), 1 << 15,
                                                                                            size=(33, 64))}
    old = {k: _bits(v.reshape(-1)).reshape(v.shape).view(torch.bfloat16) for k, v in old.items()}
    new = {k: v.clone() for k, v in old.items()}
    for name, fraction in (("embed", 0.3), ("proj", 0.01)):
        flat = new[name].view(torch.int16).view(-1)
        at = torch.from_numpy(rng.choice(flat.numel(), size=int(flat.numel() * fraction), replace=False))
        flat[at] += torch.from_numpy(rng.integers(1, 40, size=at.numel()).astype(np.int16))
    layout = ModelLayout.identity(old)
    total = None
    for rank in range(2):
        def rows(state, rank=rank):
            return rank_rows(layout, state, rank, 2)
        pieces = list(row_pieces(layout, rows(old), rows(new)))
        result = _assert_same(layout, pieces)
        total = result[3] if total is None else total + result[3]
        assert len([c for ref in result[1] for c in ref.chunks]) >= 3  # the embedding's rows cut in two chunks
    assert total == digest_state(layout, new) - digest_state(layout, old)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=3), density=st.floats(0.0, 1.0),
       spread=st.sampled_from([1, 2, 300, 1 << 15]), seed=st.integers(0, 2**32 - 1),
       values=st.sampled_from(["delta16", "raw"]), entropy=st.sampled_from(["zstd", "none"]))
def test_random_states_and_change_patterns_encode_identically(sizes, density, spread, seed, values, entropy):
    rng = np.random.default_rng(seed)
    old = {f"t{k}": rng.integers(-(1 << 15), 1 << 15, size=size).astype(np.int16) for k, size in enumerate(sizes)}
    new = {}
    for name, bits in old.items():
        changed = rng.random(bits.size) < density
        step = rng.integers(-spread, spread + 1, size=bits.size).astype(np.int16)
        new[name] = np.where(changed, bits + step, bits).astype(np.int16)
        new[name][changed & (new[name] == bits)] ^= 1  # a chosen change is a change
    layout = ModelLayout.identity({k: torch.zeros(v.size, dtype=torch.bfloat16) for k, v in old.items()})
    pieces = [Piece(t, 0, _bits(old[t.name]), _bits(new[t.name])) for t in layout.tensors]
    params = CodecParams(segment_bytes=4096, values=values, entropy=entropy)
    result = _assert_same(layout, pieces, params)
    assert sum(result[2].values()) == sum(int((old[k] != new[k]).sum()) for k in old)


@pytest.mark.parametrize("block", [64, 1 << 24])
def test_changed_indices_of_any_length_and_block(monkeypatch, block):
    # Masks read as 8-element words, padded at the end: lengths off the word size, changes on word and block
    # edges, all-changed and unchanged words, against numpy.
    monkeypatch.setattr(extract_module, "MASK_BLOCK", block)
    rng = np.random.default_rng(block)
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 200, 1001):
        old = rng.integers(-(1 << 15), 1 << 15, size=n).astype(np.int16)
        new = old.copy()
        changed = rng.random(n) < 0.3
        changed[[i for i in (0, 7, 8, 63, 64, n - 1) if 0 <= i < n]] = True
        changed[100:140] = True
        new[changed] ^= 0x0101
        got = extract_module.changed_indices(_bits(old), _bits(new))
        assert got.dtype == torch.int64 and got.tolist() == np.flatnonzero(old != new).tolist()
        assert extract_module.changed_indices(_bits(old), _bits(old)).numel() == 0
