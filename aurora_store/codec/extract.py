"""Finding what changed, where the weights live: old/new bit patterns → sorted changed indices and their
old and new bits on the host.

Two implementations with one output (:class:`Changes`):

* :func:`host_changes` (one piece: :func:`changes_on_host`) — the reference: compare, gather and hash in
  compiled host kernels (:mod:`.kernels`); the host encoder's extraction.
* :class:`DeviceExtraction` — the bit compare, the changed-index and bits gather and the digest update
  for the changed elements run with torch ops on the tensors' own device (a GPU finds the changed
  elements of 16 GB in milliseconds); only the changed indices and their old/new bits are copied to the
  host, into pinned buffers when the device is CUDA, asynchronously, one piece ahead. The digest lanes
  accumulate on the device and cross once, at the end. The encoder's device path goes further and builds
  the raw streams on the device too (:mod:`.device_encode`, which finds the changes with
  :func:`changed_indices`); this class is extraction alone (``scripts/device-check`` times it).

On CPU tensors the device path runs the same torch ops on the CPU, so a test there proves the code the
GPU runs produces byte-identical segments and the same digest as the reference.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from aurora_store.codec import kernels
from aurora_store.codec.digest import ZERO, WeightsDigest, digest_of_lanes, lanes_on_device, tensor_seeds
from aurora_store.codec.layout import InferenceTensor

_Item = TypeVar("_Item")
_Launched = TypeVar("_Launched")
_Landed = TypeVar("_Landed")

#: Pieces extracted ahead of the one being encoded (each holds only changed elements on the host).
PREFETCH = 1


@dataclass(frozen=True)
class Changes:
    """The changed elements of one piece: ``indices`` local to the piece (sorted), their bits before/after."""

    tensor: InferenceTensor
    offset: int  # flat index of the piece's first element in its inference tensor
    numel: int  # elements in the piece
    indices: np.ndarray  # int64
    old: np.ndarray  # int16
    new: np.ndarray  # int16


#: Blocks the host extraction computes ahead of the one the encoder takes (~20 ms of work; each holds only
#: its changed elements): enough that the threads stay busy while the encoder's thread waits for a core.
BLOCKS_AHEAD = 16

MASK_BLOCK = 1 << 24  # elements compared at once when looking for changes (host and device)


_WORD = 8  # bytes of a bool mask read as one int64 word


def _mask(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``old != new`` as a bool mask padded with ``False`` to whole int64 words."""
    n = old.numel()
    mask = torch.empty(-(-n // _WORD) * _WORD, dtype=torch.bool, device=old.device)
    torch.ne(old, new, out=mask[:n])
    mask[n:] = False
    return mask


def _counts(mask: torch.Tensor) -> torch.Tensor:
    """``[words holding a change, changes]`` of a padded mask, on its device."""
    return torch.stack([torch.count_nonzero(mask.view(torch.int64)), torch.count_nonzero(mask)])


def _positions(mask: torch.Tensor, words: int, changes: int) -> torch.Tensor:
    """Where a padded mask holds, given its :func:`_counts`: the words holding a change first (1/8 of the
    mask; at RL densities ~10 % of them hold one), then the changes among those words' 8 elements — both
    ``nonzero_static`` of a known size, so no sync (on one CPU thread, 4 M elements with 1.3 % scattered
    changes: 7.7 ms against 14.1 ms for ``nonzero(old != new)``; ~10 % less over a whole model's pieces)."""
    held = torch.nonzero_static(mask.view(torch.int64), size=words).reshape(-1)
    candidates = (held.unsqueeze(1) * _WORD + torch.arange(_WORD, device=mask.device)).reshape(-1)
    return candidates.index_select(0, torch.nonzero_static(mask.index_select(0, candidates), size=changes).reshape(-1))


def changed_indices(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Sorted flat indices (int64) where the bit patterns of two flat tensors differ, on their device.

    Compared in blocks of :data:`MASK_BLOCK`: the boolean mask and the selection's scratch stay bounded (an
    embedding piece is 10^8+ elements, its whole mask ~0.13x a 0.6B model); only the changed indices,
    proportional to the delta, are kept. One sync per piece on a device: the count pass (every block's counts
    in one small tensor, read back once); a piece of one block keeps its mask for the selection, a larger one
    compares each block again (no sync: the sizes are known)."""
    n = old.numel()
    if n <= MASK_BLOCK:
        mask = _mask(old, new)
        words, changes = _counts(mask).tolist()
        return _positions(mask, words, changes)
    starts = range(0, n, MASK_BLOCK)
    counts = torch.stack([_counts(_mask(old[lo: lo + MASK_BLOCK], new[lo: lo + MASK_BLOCK]))
                          for lo in starts]).tolist()
    parts = [_positions(_mask(old[lo: lo + MASK_BLOCK], new[lo: lo + MASK_BLOCK]), words, changes) + lo
             for lo, (words, changes) in zip(starts, counts) if changes]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=old.device)


def changes_on_host(tensor: InferenceTensor, offset: int, old: torch.Tensor,
                    new: torch.Tensor, *, threads: int | None = None) -> tuple[Changes, WeightsDigest]:
    """The reference extraction of one piece on the host, with the piece's digest delta (see
    :func:`host_changes`)."""
    return next(host_changes([(tensor, offset, old, new)], threads=threads))


def host_changes(pieces: Iterable[tuple[InferenceTensor, int, torch.Tensor, torch.Tensor]], *,
                 threads: int | None = None) -> Iterator[tuple[Changes, WeightsDigest]]:
    """The reference extraction on host tensors: each piece's :class:`Changes` and digest delta, in order. One
    compiled sweep per block (compare, and gather the changed elements' indices and bits), then the digest
    move over the block's changed elements only. The blocks of all pieces form one stream spread over
    ``threads`` threads, a few blocks ahead: a model is mostly 1–4 M-element pieces, and splitting each alone
    left a thread idle at every piece's end (2 threads did 1.0× one on Qwen3-0.6B's layers)."""
    parts: list[_Block] = []
    for part in kernels.map_ahead(_compare_block, _blocks(pieces), threads, ahead=BLOCKS_AHEAD):
        parts.append(part)
        if part.last:
            yield _assembled(parts)
            parts = []


@dataclass(frozen=True)
class _Block:
    tensor: InferenceTensor
    offset: int
    numel: int  # of the piece
    last: bool  # the piece's last block
    indices: np.ndarray
    old: np.ndarray
    new: np.ndarray
    lanes: tuple[int, int]


def _blocks(pieces: Iterable[tuple[InferenceTensor, int, torch.Tensor, torch.Tensor]]) -> Iterator[tuple]:
    for tensor, offset, old, new in pieces:
        a, b = _host_int16(old), _host_int16(new)
        seeds = tensor_seeds(tensor.name)
        bounds = kernels.split(a.size)
        for k, (lo, hi) in enumerate(bounds):
            yield tensor, offset, seeds, a, b, lo, hi, k == len(bounds) - 1


def _compare_block(tensor: InferenceTensor, offset: int, seeds: tuple[np.uint64, np.uint64], a: np.ndarray,
                   b: np.ndarray, lo: int, hi: int, last: bool) -> _Block:
    # The block's digest move is summed in its own thread, right after its compare (lanes add mod 2**64, so
    # the order of blocks does not matter).
    s0, s1 = seeds
    local, before, after = kernels.changes(a[lo:hi], b[lo:hi], lo)
    return _Block(tensor, offset, a.size, last, local, before, after,
                  kernels.delta_lanes(local, offset, before, after, s0, s1))


def _assembled(parts: list[_Block]) -> tuple[Changes, WeightsDigest]:
    first = parts[0]
    if len(parts) == 1:
        local, old_vals, new_vals = first.indices, first.old, first.new
    else:
        local, old_vals, new_vals = (np.concatenate([getattr(p, k) for p in parts]) for k in ("indices", "old", "new"))
    delta = _lanes_digest([p.lanes for p in parts])
    return Changes(first.tensor, first.offset, first.numel, local, old_vals, new_vals), delta


def _lanes_digest(lanes: list[tuple[int, int]]) -> WeightsDigest:
    return WeightsDigest((sum(int(s0) for s0, _ in lanes) % (1 << 64), sum(int(s1) for _, s1 in lanes) % (1 << 64)))


def _host_int16(bits: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(bits.reshape(-1).numpy())


def pipelined(items: Iterable[_Item], launch: Callable[[_Item], _Launched | None],
              land: Callable[[_Launched], _Landed], depth: int) -> Iterator[_Landed]:
    """``land(launch(item))`` for every item whose launch is not ``None``, in order, with up to ``depth`` items
    launched ahead of the one landing: a device works on the next pieces while the host encodes this one."""
    queue: deque[_Launched] = deque()
    for item in items:
        flight = launch(item)
        if flight is None:
            continue
        queue.append(flight)
        while len(queue) > depth:
            yield land(queue.popleft())
    while queue:
        yield land(queue.popleft())


@dataclass
class _InFlight:
    changes_of: tuple[InferenceTensor, int, int]
    indices: torch.Tensor
    old: torch.Tensor
    new: torch.Tensor
    ready: torch.cuda.Event | None  # set when the copy to the (pinned) host buffers has finished


class DeviceExtraction:
    """Iterate over :class:`Changes` of ``(tensor, offset, old_bits, new_bits)`` pieces with torch ops on the
    pieces' device; read :meth:`digest_delta` once iteration is over."""

    def __init__(self, pieces: Iterable[tuple[InferenceTensor, int, torch.Tensor, torch.Tensor]], *,
                 prefetch: int = PREFETCH) -> None:
        self._pieces = pieces
        self._prefetch = max(0, prefetch)
        self._lanes: torch.Tensor | None = None
        self._finished = False

    def digest_delta(self) -> WeightsDigest:
        if not self._finished:
            raise RuntimeError("digest_delta is known once every piece has been extracted")
        return ZERO if self._lanes is None else digest_of_lanes(self._lanes)

    def __iter__(self) -> Iterator[Changes]:
        yield from pipelined(self._pieces, lambda piece: self._launch(*piece), self._land, self._prefetch)
        self._finished = True

    def _launch(self, tensor: InferenceTensor, offset: int, old: torch.Tensor,
                new: torch.Tensor) -> _InFlight | None:
        device = new.device
        # Compare bit patterns (int16 views), never floats: NaN, -0.0 and inf compare exactly.
        local = changed_indices(old, new)  # sorted; one sync per block of the piece (its size)
        if local.numel() == 0:
            return None
        old_vals, new_vals = old[local], new[local]
        global_idx = local + offset
        lanes = lanes_on_device(tensor.name, global_idx, new_vals) - lanes_on_device(tensor.name, global_idx, old_vals)
        self._lanes = lanes if self._lanes is None else self._lanes + lanes
        if device.type != "cuda":
            return _InFlight((tensor, offset, old.numel()), local.cpu(), old_vals.cpu(), new_vals.cpu(), None)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (local, old_vals, new_vals)]
        for dst, src in zip(host, (local, old_vals, new_vals)):
            dst.copy_(src, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
        return _InFlight((tensor, offset, old.numel()), host[0], host[1], host[2], ready)

    @staticmethod
    def _land(flight: _InFlight) -> Changes:
        if flight.ready is not None:
            flight.ready.synchronize()
        tensor, offset, numel = flight.changes_of
        return Changes(tensor, offset, numel, flight.indices.numpy(), flight.old.numpy(), flight.new.numpy())
