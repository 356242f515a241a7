"""Compiled host kernels: the passes over every element (bit compare, digest) in one sweep each.

numpy needs ~10 passes over memory for the digest of a block (xor, three shift-xors, two multiplies, the
key build, the sum, for each of two lanes) and three for a change scan (compare, ``nonzero``, gathers); the
kernels here read each element once and keep everything else in registers. They are compiled by numba on
first use and cached on disk (``cache=True``), release the GIL (``nogil=True``), and work on one block:
:func:`split` and :func:`run_blocks` spread blocks over threads, and the callers add the blocks' results
(digest lanes add modulo 2**64, so the order of blocks does not matter; change lists are concatenated in
block order, so the output is the same for every thread count).

Integer typing is kept explicit (``np.uint64`` everywhere in the hash): numba promotes ``uint64 op int64`` to
float64, which would silently break the arithmetic.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_K1 = np.uint64(0xFF51AFD7ED558CCD)
_K2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S16 = np.uint64(16)
_LOW16 = np.uint64(0xFFFF)
_ZERO = np.uint64(0)

#: Elements per block handed to one thread: large enough that a call's overhead (~µs, ~50 µs for a hand-off
#: to the pool) is noise against its ~1 ms of work, small enough that the 1–4 M-element pieces most model
#: tensors are made of split over two threads or more (at 4 M most were one block, so one thread).
BLOCK = 1 << 20
#: Host threads when a caller does not say: the cores, at most 8 (more only adds memory-bandwidth contention).
DEFAULT_THREADS = max(1, min(8, os.cpu_count() or 1))


@numba.njit(inline="always")
def _fmix(y):  # pragma: no cover - compiled
    y ^= y >> _S33
    y *= _K1
    y ^= y >> _S33
    y *= _K2
    y ^= y >> _S33
    return y


@numba.njit(nogil=True, cache=True)
def range_lanes(bits, offset, seed0, seed1):  # pragma: no cover - compiled
    """``Σ fmix64(((offset + i) << 16 | bits[i]) ^ seed)`` over a contiguous int16 block, both lanes."""
    s0 = _ZERO
    s1 = _ZERO
    base = np.uint64(offset)
    for i in range(bits.size):
        key = ((base + np.uint64(i)) << _S16) | (np.uint64(bits[i]) & _LOW16)
        s0 += _fmix(key ^ seed0)
        s1 += _fmix(key ^ seed1)
    return s0, s1


@numba.njit(nogil=True, cache=True)
def element_lanes(indices, bits, seed0, seed1):  # pragma: no cover - compiled
    """``Σ fmix64((indices[i] << 16 | bits[i]) ^ seed)`` over scattered elements, both lanes."""
    s0 = _ZERO
    s1 = _ZERO
    for i in range(bits.size):
        key = (np.uint64(indices[i]) << _S16) | (np.uint64(bits[i]) & _LOW16)
        s0 += _fmix(key ^ seed0)
        s1 += _fmix(key ^ seed1)
    return s0, s1


@numba.njit(nogil=True, cache=True)
def delta_lanes(indices, offset, old, new, seed0, seed1):  # pragma: no cover - compiled
    """The digest move of changing ``old[i]`` to ``new[i]`` at flat index ``offset + indices[i]``:
    ``Σ h(new) − h(old)`` per lane, modulo 2**64."""
    s0 = _ZERO
    s1 = _ZERO
    base = np.uint64(offset)
    for i in range(old.size):
        at = (base + np.uint64(indices[i])) << _S16
        k_new = at | (np.uint64(new[i]) & _LOW16)
        k_old = at | (np.uint64(old[i]) & _LOW16)
        s0 += _fmix(k_new ^ seed0) - _fmix(k_old ^ seed0)
        s1 += _fmix(k_new ^ seed1) - _fmix(k_old ^ seed1)
    return s0, s1


@numba.njit(nogil=True, cache=True)
def changes(old, new, base):  # pragma: no cover - compiled
    """Where two int16 blocks differ: ``(base + i, old[i], new[i])`` for every such ``i``, ascending.

    One sweep: the outputs start at 1/32 of the block (RL steps change 1–3 % of the weights) and double
    when full, so memory is read once and nothing proportional to the block is allocated but the output."""
    n = old.size
    cap = max(1024, n >> 5)
    idx = np.empty(cap, dtype=np.int64)
    before = np.empty(cap, dtype=np.int16)
    after = np.empty(cap, dtype=np.int16)
    i, k = _fill(old, new, base, 0, idx, before, after, 0)
    while i < n:  # the outputs are full: double them (rare) and go on where the sweep stopped
        cap *= 2
        idx, before, after = _grown(idx, cap), _grown(before, cap), _grown(after, cap)
        i, k = _fill(old, new, base, i, idx, before, after, k)
    return idx[:k].copy(), before[:k].copy(), after[:k].copy()


@numba.njit(nogil=True, cache=True)
def _fill(old, new, base, start, idx, before, after, k):  # pragma: no cover - compiled
    """The sweep of :func:`changes` from element ``start``, writing from output ``k``; stops at the first
    change that does not fit. Returns ``(where it stopped, outputs written)``. The arrays are not
    reassigned inside the loop, which keeps it free of reference counting."""
    cap = idx.size
    for i in range(start, old.size):
        a = old[i]
        b = new[i]
        if a != b:
            if k == cap:
                return i, k
            idx[k] = base + i
            before[k] = a
            after[k] = b
            k += 1
    return old.size, k


@numba.njit(nogil=True, cache=True)
def _grown(arr, cap):  # pragma: no cover - compiled
    out = np.empty(cap, dtype=arr.dtype)
    out[: arr.size] = arr
    return out


# --- spreading blocks over threads ---------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_T = TypeVar("_T")


_POOL_WORKERS = max(DEFAULT_THREADS, 8)  # any count up to 8 a caller asks for is honoured
_POOL_PREFIX = "aurora-kernel"


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_POOL_WORKERS, thread_name_prefix=_POOL_PREFIX)
        return _pool


def split(n: int, block: int | None = None) -> list[tuple[int, int]]:
    """``[lo, hi)`` bounds of consecutive blocks of :data:`BLOCK` elements covering ``n`` (one empty block for
    ``n == 0``)."""
    block = BLOCK if block is None else block
    return [(lo, min(lo + block, n)) for lo in range(0, n, block)] or [(0, 0)]


def run_blocks(fn: Callable[..., _T], tasks: Sequence[tuple], threads: int | None = None) -> list[_T]:
    """``[fn(*task) for task in tasks]``, in order, on up to ``threads`` threads (the kernels release the GIL).
    One thread, one task, or a call from a pool thread runs in the caller's thread.

    Returns or raises only once no task is running: the tasks read and write buffers the caller owns (a
    segment being staged, a tensor's slice), which it may free or reuse as soon as this returns. After a task
    fails, no further task starts; the error raised is the one the earliest failing task raised, as in the
    serial loop (every task before it had already started, and is waited for)."""
    threads = DEFAULT_THREADS if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, not {threads}")
    # A task that itself spreads blocks runs them inline: pool threads never wait on the pool (no deadlock).
    if threads == 1 or len(tasks) <= 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        return [fn(*task) for task in tasks]
    results: list[_T | None] = [None] * len(tasks)
    failures: list[tuple[int, BaseException]] = []
    cursor = iter(range(len(tasks)))
    lock = threading.Lock()

    def worker() -> None:
        # Each worker takes the next task until none is left or one has failed.
        while True:
            with lock:
                k = None if failures else next(cursor, None)
            if k is None:
                return
            try:
                results[k] = fn(*tasks[k])
            except BaseException as exc:  # re-raised in the caller's thread below
                with lock:
                    failures.append((k, exc))
                return

    pool = _executor()
    wait([pool.submit(worker) for _ in range(min(threads, len(tasks), _POOL_WORKERS))])
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]
    return results  # type: ignore[return-value]


def map_ahead(fn: Callable[..., _T], tasks: Iterable[tuple], threads: int | None = None,
              ahead: int | None = None) -> Iterator[_T]:
    """``fn(*task)`` for each of ``tasks``, yielded in order, computed on up to ``threads`` threads and up to
    ``ahead`` tasks (default ``2 × threads``) ahead of the one yielded: the streaming form of
    :func:`run_blocks`, for work that arrives as many small units (a model's pieces, block by block) where
    splitting each unit alone would leave threads idle at every unit's end. ``tasks`` is read lazily, in the
    consumer's thread.

    As with :func:`run_blocks`: the error raised is the earliest failing task's, and neither an error nor the
    consumer stopping early returns before every started task has finished (they read the caller's buffers)."""
    threads = DEFAULT_THREADS if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, not {threads}")
    if threads == 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        for task in tasks:
            yield fn(*task)
        return
    ahead = 2 * threads if ahead is None else max(1, ahead)
    window: deque[Future[_T]] = deque()
    # Its own pool, sized to ``threads`` (the shared one has up to 8 workers); its threads carry the pool
    # prefix, so a task that spreads blocks itself runs them inline.
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=_POOL_PREFIX)
    try:
        for task in tasks:
            window.append(pool.submit(fn, *task))
            while len(window) > ahead:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:
        for future in window:
            future.cancel()
        pool.shutdown(wait=True)


# --- per-changed-element streams (FORMAT §3.1, §3.2): the same bytes as the numpy formulation ------------

@numba.njit(nogil=True, cache=True)
def leb128_gaps(idx, lo):  # pragma: no cover - compiled
    """Planar LEB128 of the gaps ``idx[0] - lo, idx[1] - idx[0], …`` (sorted ``idx`` ≥ ``lo``): byte 0 of every
    value, then byte 1 of the values that have one, and so on (see :mod:`.leb128`)."""
    n = idx.size
    levels = np.zeros(10, dtype=np.int64)  # values with more than k bytes, per level k
    prev = lo
    for i in range(n):
        gap = np.uint64(idx[i] - prev)
        prev = idx[i]
        level = 0
        while True:
            levels[level] += 1
            gap >>= np.uint64(7)
            if gap == 0:
                break
            level += 1
    starts = np.zeros(10, dtype=np.int64)
    for level in range(1, 10):
        starts[level] = starts[level - 1] + levels[level - 1]
    out = np.empty(starts[9] + levels[9], dtype=np.uint8)
    prev = lo
    for i in range(n):
        gap = np.uint64(idx[i] - prev)
        prev = idx[i]
        level = 0
        while True:
            rest = gap >> np.uint64(7)
            byte = np.uint8(gap & np.uint64(0x7F))
            if rest != 0:
                byte |= np.uint8(0x80)
            out[starts[level]] = byte
            starts[level] += 1
            if rest == 0:
                break
            gap = rest
            level += 1
    return out


@numba.njit(nogil=True, cache=True)
def delta16_values(old, new):  # pragma: no cover - compiled
    """The ``DELTA16`` value stream of changed elements ``old`` → ``new`` (see :mod:`.values`): the 2-bit class
    table, the side bits of class 2, the escaped words as two byte planes."""
    n = old.size
    words = np.empty(n, dtype=np.uint16)
    n_mid = 0
    n_escape = 0
    for i in range(n):
        d = np.int16(new[i] - old[i])  # wraps modulo 2**16
        w = np.uint16((np.uint16(d) << np.uint16(1)) ^ np.uint16(d >> np.int16(15)))
        words[i] = w
        if w == 3 or w == 4:
            n_mid += 1
        elif w != 1 and w != 2:
            n_escape += 1
    class_bytes = (n + 3) // 4
    mid_bytes = (n_mid + 7) // 8
    out = np.zeros(class_bytes + mid_bytes + 2 * n_escape, dtype=np.uint8)
    mid_at = 0
    escape_at = 0
    side = class_bytes
    low = class_bytes + mid_bytes
    high = low + n_escape
    for i in range(n):
        w = words[i]
        if w == 1:
            c = 0
        elif w == 2:
            c = 1
        elif w == 3 or w == 4:
            c = 2
            if w == 4:
                out[side + (mid_at >> 3)] |= np.uint8(1 << (mid_at & 7))
            mid_at += 1
        else:
            c = 3
            out[low + escape_at] = np.uint8(w & np.uint16(0xFF))
            out[high + escape_at] = np.uint8(w >> np.uint16(8))
            escape_at += 1
        out[i >> 2] |= np.uint8(c << (2 * (i & 3)))
    return out


# --- decoding the per-changed-element streams: every check of the numpy reference decoders --------------
#
# The reference decoders (:func:`.leb128.decode`, :func:`.values.decode_values`) stay the format's
# definition; these do the same work in two sweeps each and report what is wrong as a status code (the
# callers raise the typed error), so a corrupt stream fails with the same class — and the same message —
# as through the reference.

#: Status codes of :func:`gap_indices`.
LEB_OK, LEB_SHORT, LEB_OVERLONG, LEB_TRUNCATED, LEB_LEFTOVER, LEB_NOT_INCREASING, LEB_OUT_OF_RANGE = range(7)
#: Status codes of :func:`delta16_apply`.
VAL_OK, VAL_SHORT, VAL_CLASS_PADDING, VAL_LENGTH, VAL_SIDE_PADDING, VAL_ESCAPE = range(6)

_LEB_LEVELS = 9  # as leb128.MAX_BYTES: 9 × 7 = 63 bits


@numba.njit(nogil=True, cache=True)
def gap_indices(raw, count, lo, span):  # pragma: no cover - compiled
    """``lo + cumsum(gaps)`` of ``count`` planar LEB128 gaps in ``raw`` (uint8), checked: the stream holds
    exactly ``count`` values of at most 9 bytes, gaps after the first are ≥ 1 (strictly increasing) and the
    last local index is below ``span``. Returns ``(int64 indices, status)``; the indices are meaningful only
    when the status is :data:`LEB_OK` (see :func:`gap_indices_into`)."""
    out = np.empty(count, dtype=np.int64)
    return out, gap_indices_into(raw, count, lo, span, out)


@numba.njit(nogil=True, cache=True)
def gap_indices_into(raw, count, lo, span, out):  # pragma: no cover - compiled
    """:func:`gap_indices` written into ``out`` (int64, at least ``count`` long: staging decodes every chunk of
    a tensor straight into its slice of the tensor's indices); returns the status.

    Sweep 1 finds each level's extent from the continuation bits (the structure checks, in the reference's
    order); sweep 2 rebuilds the values in order with one cursor per level — value ``i``'s byte ``k`` is the
    next unread byte of level ``k`` — and accumulates them. Zero gaps are counted and the running index
    saturates at the span, so that, as in the reference, a stream with both faults reports the order first."""
    n = raw.size
    if n < count:
        return LEB_SHORT
    starts = np.zeros(_LEB_LEVELS, dtype=np.int64)
    start = 0
    size = count
    level = 0
    while size > 0:
        if level == _LEB_LEVELS:
            return LEB_OVERLONG
        if start + size > n:
            return LEB_TRUNCATED
        starts[level] = start
        more = 0
        for j in range(start, start + size):
            more += raw[j] >> 7
        start += size
        size = more
        level += 1
    if start != n:
        return LEB_LEFTOVER
    # Sweep 2, branch-free for gaps of 1–2 bytes (< 16384: nearly all at RL densities); longer ones take the
    # general path. A level-1 byte is always loaded (clamped in range) and used only if the value continues.
    limit = np.uint64(span)
    local = np.uint64(0)
    zeros = 0
    last = n - 1
    c0 = starts[0]
    c1 = starts[1] if level > 1 else last
    for i in range(count):
        b0 = np.int64(raw[c0])
        c0 += 1
        m0 = b0 >> 7
        b1 = np.int64(raw[min(c1, last)])
        c1 += m0
        gap = np.uint64((b0 & 0x7F) | (((b1 & 0x7F) << 7) * m0))
        if m0 & (b1 >> 7):  # a third byte or more: rare
            byte = b1
            shift = np.uint64(14)
            k = 2
            while byte & 0x80:
                at = starts[k]
                starts[k] = at + 1
                byte = np.int64(raw[at])
                gap |= np.uint64(byte & 0x7F) << shift
                shift += np.uint64(7)
                k += 1
        zeros += gap == 0
        if i == 0:
            zeros -= gap == 0  # the first gap may be 0 (the chunk's first element)
        # Saturating at the span: no wrap-around (a gap has at most 63 bits), and once out, always out.
        local = min(local + gap, limit)
        out[i] = lo + np.int64(local)
    if zeros:  # a zero gap after the first: not strictly increasing
        return LEB_NOT_INCREASING
    if local >= limit:
        return LEB_OUT_OF_RANGE
    return LEB_OK


def _class_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per class-table byte: how many of its four 2-bit classes are 2 (a side bit) and 3 (an escape)."""
    mids = np.zeros(256, dtype=np.int64)
    escapes = np.zeros(256, dtype=np.int64)
    for b in range(256):
        classes = [(b >> (2 * k)) & 3 for k in range(4)]
        mids[b] = classes.count(2)
        escapes[b] = classes.count(3)
    return mids, escapes


_MIDS, _ESCAPES = _class_tables()


@numba.njit(nogil=True, cache=True)
def delta16_apply(indices, old, raw, out, seed0, seed1):  # pragma: no cover - compiled
    """Decode a ``DELTA16`` value stream (see :mod:`.values`) of ``old.size`` changed elements against their
    ``old`` bits into ``out`` (int16), and sum the digest move ``Σ h(new) − h(old)`` at flat ``indices``
    (both lanes) in the same sweep. Returns ``(status, lane 0, lane 1)``; ``out`` and the lanes are
    meaningful only when the status is :data:`VAL_OK`. Checks, in the reference's order: the class table
    fits, its padding is zero, the stream's length is what the table implies, the side stream's padding
    is zero, and no escaped word is 0 or one a short class holds (1–4)."""
    count = old.size
    status, class_bytes, mid_bytes, n_escape = _delta16_table(raw, count)
    if status != VAL_OK:
        return status, _ZERO, _ZERO
    # Three loops: every element as if its class were 0 or 1 (±1 ulp, ~85–90 % of them; no branches), then
    # the class bytes holding a class 2 or 3 revisited in order (the side and escape streams are read in
    # order too), then the digest move (a loop the compiler vectorises). A branch per element on its class
    # would mispredict often; a fused or blocked loop measured ~2x slower than these three.
    for i in range(count):
        out[i] = _short_class(raw, old[i], i)
    return _delta16_finish(indices, old, raw, out, class_bytes, mid_bytes, n_escape, seed0, seed1)


@numba.njit(inline="always")
def _delta16_table(raw, count):  # pragma: no cover - compiled
    """The class table's structure checks: ``(status, class bytes, side-stream bytes, escaped words)``."""
    class_bytes = (count + 3) // 4
    if raw.size < class_bytes:
        return VAL_SHORT, 0, 0, 0
    tail = count & 3
    if tail and raw[class_bytes - 1] >> (2 * tail):
        return VAL_CLASS_PADDING, 0, 0, 0
    n_mid = 0
    n_escape = 0
    for j in range(class_bytes):  # padding classes are 0 (just checked): they count as neither
        n_mid += _MIDS[raw[j]]
        n_escape += _ESCAPES[raw[j]]
    mid_bytes = (n_mid + 7) // 8
    if raw.size != class_bytes + mid_bytes + 2 * n_escape:
        return VAL_LENGTH, 0, 0, 0
    if mid_bytes and n_mid & 7 and raw[class_bytes + mid_bytes - 1] >> (n_mid & 7):
        return VAL_SIDE_PADDING, 0, 0, 0
    return VAL_OK, class_bytes, mid_bytes, n_escape


@numba.njit(inline="always")
def _short_class(raw, old, i):  # pragma: no cover - compiled
    """Element ``i``'s new bits if its class is 0 or 1 (±1 ulp): its low class bit picks the sign."""
    w = ((np.int64(raw[i >> 2]) >> (2 * (i & 3))) & 1) + 1
    return np.int16(np.int64(old) + ((w >> 1) ^ -(w & 1)))  # un-zigzag; wraps modulo 2**16


@numba.njit(inline="always")
def _delta16_finish(indices, old, raw, out, class_bytes, mid_bytes, n_escape, seed0,
                    seed1):  # pragma: no cover - compiled
    """The last two loops of :func:`delta16_apply`: classes 2 and 3 put right, then the digest move."""
    count = old.size
    side = class_bytes
    low = class_bytes + mid_bytes
    high = low + n_escape
    mid_at = 0
    escape_at = 0
    bad = False
    for j in range(class_bytes):
        b = np.int64(raw[j])
        if b & 0xAA:  # some class is 2 or 3 (padding classes are 0)
            for k in range(4):
                c = (b >> (2 * k)) & 3
                if c >= 2:
                    if c == 2:
                        w = 3 + ((np.int64(raw[side + (mid_at >> 3)]) >> (mid_at & 7)) & 1)
                        mid_at += 1
                    else:
                        w = np.int64(raw[low + escape_at]) | (np.int64(raw[high + escape_at]) << 8)
                        escape_at += 1
                        bad |= w <= 4
                    i = 4 * j + k
                    out[i] = np.int16(np.int64(old[i]) + ((w >> 1) ^ -(w & 1)))
    if bad:
        return VAL_ESCAPE, _ZERO, _ZERO
    s0 = _ZERO
    s1 = _ZERO
    for i in range(count):
        at = np.uint64(indices[i]) << _S16
        k_new = at | (np.uint64(out[i]) & _LOW16)
        k_old = at | (np.uint64(old[i]) & _LOW16)
        s0 += _fmix(k_new ^ seed0) - _fmix(k_old ^ seed0)
        s1 += _fmix(k_new ^ seed1) - _fmix(k_old ^ seed1)
    return VAL_OK, s0, s1


@intrinsic
def _prefetch(typingctx, arr, at):  # pragma: no cover - compiled
    """A read prefetch of ``arr[at]`` into all cache levels (``llvm.prefetch``; opaque-pointer name, LLVM ≥ 15)."""

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        module = builder.module
        name = "llvm.prefetch.p0"
        fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                                    name=name)
        address = builder.bitcast(builder.gep(array.data, [args[1]]), byte_ptr)
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, at), codegen


#: Gathers ahead that :func:`take16` prefetches: the element loads of a sparse sorted gather miss the cache
#: one after another; asking 64 ahead keeps enough misses in flight (measured ~2x, to a scatter's speed).
_PREFETCH_AHEAD = 64


@numba.njit(nogil=True, cache=True)
def take16(bits, indices, out):  # pragma: no cover - compiled
    """``out[i] = bits[indices[i]]`` for 16-bit ``bits`` and int64 ``indices`` the caller has checked to lie in
    range (no checks here): ``numpy.take`` spends ~3x a scatter's time per element on its generic path."""
    n = indices.size
    for i in range(n):
        if i + _PREFETCH_AHEAD < n:
            _prefetch(bits, indices[i + _PREFETCH_AHEAD])
        out[i] = bits[indices[i]]


@numba.njit(nogil=True, cache=True)
def delta16_gather_apply(indices, offset, bits, raw, old, out, seed0, seed1):  # pragma: no cover - compiled
    """:func:`delta16_apply` reading the old bits itself: ``old[i] = bits[indices[i] − offset]`` (a piece of
    a target's storage that starts at flat index ``offset``; the caller has checked every index lies in it),
    in a sweep of its own prefetched as :func:`take16` does (folding the decoding into that sweep measured no
    faster: the gather is bound by memory), then decoded as :func:`delta16_apply` does — one call per chunk, no
    cut or copy of its indices. Same status and lanes as :func:`delta16_apply`."""
    count = old.size
    status, class_bytes, mid_bytes, n_escape = _delta16_table(raw, count)
    if status != VAL_OK:
        return status, _ZERO, _ZERO
    for i in range(count):
        if i + _PREFETCH_AHEAD < count:
            _prefetch(bits, indices[i + _PREFETCH_AHEAD] - offset)
        was = bits[indices[i] - offset]
        old[i] = was
        out[i] = _short_class(raw, was, i)
    return _delta16_finish(indices, old, raw, out, class_bytes, mid_bytes, n_escape, seed0, seed1)
