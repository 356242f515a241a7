"""The compiled host kernels against the formulation they replaced (numpy, several passes per block): the
same digest sums, the same changed elements, for every thread count and block cut."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from aurora_store.codec import kernels
from aurora_store.codec.digest import (
    ZERO,
    WeightsDigest,
    digest_pieces,
    hash_change,
    hash_elements,
    hash_range,
)
from aurora_store.codec.extract import changes_on_host
from aurora_store.codec.layout import ModelLayout

_K1, _K2, _S33 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33)


def _reference(name: str, indices: np.ndarray, bits: np.ndarray) -> WeightsDigest:
    """The digest as the numpy implementation computed it: fmix64 lane by lane over whole arrays."""
    raw = hashlib.sha256(name.encode()).digest()
    keys = (indices.astype(np.uint64) << np.uint64(16)) | bits.view(np.uint16).astype(np.uint64)
    lanes = []
    for k in range(2):
        y = keys ^ np.uint64(int.from_bytes(raw[8 * k: 8 * k + 8], "little"))
        y ^= y >> _S33
        y *= _K1
        y ^= y >> _S33
        y *= _K2
        y ^= y >> _S33
        lanes.append(int(y.sum(dtype=np.uint64)))
    return WeightsDigest((lanes[0], lanes[1]))


@pytest.fixture
def bits() -> np.ndarray:
    rng = np.random.default_rng(3)
    out = rng.integers(-(1 << 15), 1 << 15, size=3 * 1000 + 17, dtype=np.int16)
    out[:6] = [0, -1, 0x7F80, 0x7FC0, -32768, 32767]
    return out


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_range_digest_equals_the_numpy_formulation_for_every_block_cut(monkeypatch, bits, threads):
    monkeypatch.setattr(kernels, "BLOCK", 1000)  # several blocks, the last one short
    for offset in (0, 7, (1 << 40) + 3):
        expected = _reference("a.weight", np.arange(offset, offset + bits.size, dtype=np.uint64), bits)
        assert hash_range("a.weight", offset, bits, threads=threads) == expected
        assert hash_range("a.weight", offset, torch.from_numpy(bits), threads=threads) == expected
    assert hash_range("a.weight", 5, bits[:0]) == ZERO


def test_element_and_change_digests_equal_the_numpy_formulation(bits):
    rng = np.random.default_rng(4)
    idx = np.sort(rng.choice(1 << 34, size=bits.size, replace=False)).astype(np.int64)
    assert hash_elements("b", idx, bits, threads=2) == _reference("b", idx, bits)
    assert hash_elements("b", idx.astype(np.uint64), bits.view(np.uint16)) == _reference("b", idx, bits)
    new = bits + rng.integers(1, 3, size=bits.size).astype(np.int16)
    expected = _reference("b", idx + 11, new) - _reference("b", idx + 11, bits)
    assert hash_change("b", idx, bits, new, offset=11) == expected
    assert hash_change("b", torch.from_numpy(idx + 11), torch.from_numpy(bits), torch.from_numpy(new)) == expected


def test_digest_inputs_of_the_wrong_kind_are_refused(bits):
    with pytest.raises(ValueError):
        hash_elements("b", np.arange(3), bits[:4])
    with pytest.raises(TypeError):
        hash_range("b", 0, bits.astype(np.float32))
    with pytest.raises(ValueError):
        hash_change("b", np.arange(3), bits[:3], bits[:2])
    with pytest.raises(ValueError):
        kernels.run_blocks(lambda: None, [()], threads=0)


def test_pieces_digest_is_the_sum_of_its_ranges(bits):
    pieces = [("a", 0, bits[:1000]), ("a", 1000, bits[1000:]), ("c", 3, bits)]
    expected = hash_range("a", 0, bits) + hash_range("c", 3, bits)
    assert digest_pieces(pieces, threads=1) == digest_pieces(pieces, threads=2) == expected


@pytest.mark.parametrize("threads", [1, 2])
def test_host_changes_are_the_compare_scan_in_order(monkeypatch, threads):
    monkeypatch.setattr(kernels, "BLOCK", 1 << 10)
    layout = ModelLayout.from_config({"model_type": "qwen3", "vocab_size": 64, "head_dim": 8, "hidden_size": 64,
                                      "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
                                      "intermediate_size": 96, "tie_word_embeddings": True})
    tensor = layout.tensors[0]
    rng = np.random.default_rng(5)
    old = torch.from_numpy(rng.integers(-(1 << 15), 1 << 15, size=tensor.numel, dtype=np.int16))
    new = old.clone()
    flip = torch.from_numpy(rng.random(tensor.numel) < 0.05)
    new[flip] ^= 1
    new[0], old[0] = 0, -32768  # +0.0 and -0.0: different bits, equal floats
    changes, delta = changes_on_host(tensor, 0, old, new, threads=threads)
    local = torch.nonzero(old != new).reshape(-1).numpy()
    assert np.array_equal(changes.indices, local)
    assert np.array_equal(changes.old, old.numpy()[local]) and np.array_equal(changes.new, new.numpy()[local])
    assert delta == _reference(tensor.name, local, new.numpy()[local]) - _reference(tensor.name, local,
                                                                                   old.numpy()[local])
    unchanged, zero = changes_on_host(tensor, 0, old, old.clone(), threads=threads)
    assert unchanged.indices.size == 0 and zero == ZERO


def test_change_scan_outgrows_its_first_guess():
    # Every element changed: far past the 1/32 of the block the outputs start at, so they double a few times.
    old = np.arange(5000, dtype=np.int16)
    new = old + 1
    new[4000] = old[4000]
    idx, before, after = kernels.changes(old, new, 10)
    expected = np.flatnonzero(old != new)
    assert np.array_equal(idx, expected + 10)
    assert np.array_equal(before, old[expected]) and np.array_equal(after, new[expected])


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 1000, 20_003])
def test_index_and_value_streams_are_the_reference_bytes(n):
    from aurora_store.codec import leb128
    from aurora_store.codec.segment import ValueTransform
    from aurora_store.codec.values import encode_values

    rng = np.random.default_rng(n)
    for span in (1 << 12, 1 << 40):  # one-byte gaps mostly; gaps of up to six bytes
        idx = np.sort(rng.choice(span, size=min(n, span), replace=False)).astype(np.int64) + 5
        gaps = np.diff(idx, prepend=3)
        assert kernels.leb128_gaps(idx, 3).tobytes() == leb128.encode(gaps)
    old = rng.integers(-(1 << 15), 1 << 15, size=n, dtype=np.int16)
    steps = np.array([1, -1, 2, -2, 5, -(1 << 15), (1 << 15) - 1], dtype=np.int16)  # every class, wrap-around
    new = (old + rng.choice(steps, size=n)).astype(np.int16)
    assert kernels.delta16_values(old, new).tobytes() == encode_values(old, new, ValueTransform.DELTA16)


def test_blocks_spread_from_inside_a_spread_task_run_inline():
    # A task that spreads its own blocks (e.g. a digest inside a staged tensor) must not wait on the pool
    # it runs in: with every worker busy that would never finish.
    def outer(k: int) -> int:
        return sum(kernels.run_blocks(lambda a, b: a * b, [(k, j) for j in range(5)], threads=8))

    assert kernels.run_blocks(outer, [(k,) for k in range(20)], threads=8) == [10 * k for k in range(20)]
    assert kernels.run_blocks(outer, [(k,) for k in range(20)], threads=3) == [10 * k for k in range(20)]


def test_run_blocks_raises_only_once_no_task_runs_and_reports_the_earliest_failure():
    """Staging's tasks read buffers the caller frees once run_blocks returns: a failed task must not leave
    others running (a mutated segment decoded by a stale thread crashed the suite), and the error is the
    serial loop's."""
    import threading
    import time

    running = 0
    lock = threading.Lock()
    seen_after: list[int] = []

    def task(k: int) -> int:
        nonlocal running
        with lock:
            running += 1
        try:
            if k in (3, 5):
                raise ValueError(f"task {k}")
            time.sleep(0.05)
            return k
        finally:
            with lock:
                running -= 1

    with pytest.raises(ValueError, match="task 3"):
        kernels.run_blocks(task, [(k,) for k in range(40)], threads=4)
    seen_after.append(running)
    assert seen_after == [0]
    assert kernels.run_blocks(task, [(k,) for k in (0, 1, 2)], threads=2) == [0, 1, 2]


def test_map_ahead_yields_in_order_and_spreads_over_its_threads():
    import threading
    import time

    names = set()

    def task(k: int) -> int:
        names.add(threading.current_thread().name)
        time.sleep(0.002 * (k % 3))  # finish out of order
        return k * k

    assert list(kernels.map_ahead(task, ((k,) for k in range(30)), threads=3, ahead=5)) == [k * k for k in range(30)]
    assert len(names) > 1
    names.clear()
    assert list(kernels.map_ahead(task, ((k,) for k in range(5)), threads=1)) == [k * k for k in range(5)]
    assert names == {threading.current_thread().name}
    with pytest.raises(ValueError):
        next(kernels.map_ahead(task, [(1,)], threads=0))


def test_map_ahead_raises_the_earliest_failure_and_never_leaves_a_task_running():
    """Like run_blocks: the tasks read the caller's buffers, so neither a failure nor a consumer that stops
    early may return while one still runs; the tasks are read lazily, never past the window."""
    import threading
    import time

    running = 0
    pulled = 0
    lock = threading.Lock()

    def task(k: int) -> int:
        nonlocal running
        with lock:
            running += 1
        try:
            time.sleep(0.02)
            if k in (4, 6):
                raise ValueError(f"task {k}")
            return k
        finally:
            with lock:
                running -= 1

    def tasks(n: int):
        nonlocal pulled
        for k in range(n):
            pulled += 1
            yield (k,)

    with pytest.raises(ValueError, match="task 4"):
        list(kernels.map_ahead(task, tasks(40), threads=3, ahead=3))
    assert running == 0 and pulled < 12
    results = kernels.map_ahead(task, tasks(40), threads=2, ahead=4)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    results.close()  # the consumer stops early
    assert running == 0


@pytest.mark.parametrize("threads", [(1, 2), (1,)])
def test_warm_kernels_compiles_the_publish_and_follow_paths(threads):
    """What ``warm_kernels`` runs is what a publisher and a follower into host tensors call: in a fresh process,
    every kernel those paths enter has machine code afterwards (loaded from numba's cache, or compiled), and
    none before. On one thread (what a process about to fork asks for) it leaves no thread behind."""
    import subprocess
    import sys

    entries = ["changes", "delta_lanes", "leb128_gaps", "delta16_values", "range_lanes", "gap_indices_into",
               "delta16_gather_apply"]
    probe = ("import json, sys, threading\n"
             "from aurora_store.codec import kernels\n"
             "from aurora_store.codec.warm import warm_kernels\n"
             f"names = {entries!r}\n"
             "before = [n for n in names if getattr(kernels, n).signatures]\n"
             f"warm_kernels(threads={threads!r})\n"
             "print(json.dumps([before, [n for n in names if not getattr(kernels, n).signatures],"
             " [t.name for t in threading.enumerate() if t is not threading.main_thread()]]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, missing, threads_left = json.loads(done.stdout.strip().splitlines()[-1])
    assert (before, missing) == ([], [])
    if threads == (1,):
        assert threads_left == []


_AFTER_WARM = """
import json, numba
from aurora_store.codec import activate, digest_state, kernels, stage
from aurora_store.codec.ahead import AheadStager
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.warm import warm_kernels
from aurora_store.testing.builders import encode, perturb, random_state, target_for

def signatures():
    return {name: sorted(map(str, f.signatures)) for name, f in vars(kernels).items()
            if isinstance(f, numba.core.registry.CPUDispatcher)}

warm_kernels()
warmed = signatures()
# another family and shape than the warm-up's, a tenth of the elements changed, default segments
layout = ModelLayout.from_config({"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80})
old = random_state(layout, seed=1)
manifest, segments = encode(layout, old, perturb(old, 0.1, seed=2), 1, 0, digest_state(layout, old), CodecParams())
for ahead in (False, True):
    target = target_for(layout, old, 0)
    if ahead:
        stager = AheadStager(target, manifest.codec)
        for s in segments:
            stager.add(SegmentRef(s.ref.digest, s.ref.size, ()), s.data)
        staged = stager.finish(manifest)
    else:
        staged = stage(manifest, [(s.ref, s.data) for s in segments], target, threads=2)
    activate(staged, target)
    assert str(target.digest) == manifest.weights_digest
used = signatures()
print(json.dumps({name: sorted(set(sigs) - set(warmed.get(name, []))) for name, sigs in used.items()
                  if set(sigs) - set(warmed.get(name, []))}))
"""


def test_after_warm_kernels_publishing_staging_and_decoding_ahead_compile_nothing():
    """The paths themselves, on another model, after ``warm_kernels`` in a fresh process: not one machine-code
    signature that the warm-up did not already hold (compiled, or loaded from numba's cache: either way a
    signature the dispatcher holds). Decode-ahead's read-only segment bytes once needed two more, ~1 s to
    compile, paid by a cut-through follower on its first version, on the critical path."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _AFTER_WARM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("threads", [(), (0,), (1, 0)])
def test_warm_kernels_refuses_thread_counts_below_one(threads):
    from aurora_store.codec.warm import warm_kernels

    with pytest.raises(ValueError, match="thread counts"):
        warm_kernels(threads=threads)
