"""Which elements of each inference tensor a vLLM tensor-parallel rank holds: pure maths, no vLLM.

Each worker (TP rank) receives the *global* flat indices of a write or read and keeps the ones it holds
(:class:`Shard`), so the client side does not change with TP > 1. How a global flat index ``i = r * C + c``
(row ``r``, column ``c``, ``C`` = row size) of a tensor maps to ``(rank, local index)`` with ``T`` ranks:

* column-parallel (``qkv_proj``, ``gate_up_proj``, and their biases): every component ``k`` (rows
  ``[o_k, o_k + R_k)`` of the fused tensor) is split in ``T`` row blocks of ``R_k / T``; rank ``t`` stacks
  its blocks in component order, so ``rank = (r - o_k) // (R_k / T)`` and the local row is
  ``Σ_{j<k} R_j / T + (r - o_k) mod (R_k / T)``; local index ``= local_row * C + c``. (When there are fewer KV
  heads than ranks vLLM replicates KV heads; that case is refused until it is implemented.)
* row-parallel (``o_proj``, ``down_proj``): columns are split, ``rank = c // (C / T)``, local index
  ``= r * (C / T) + c mod (C / T)``.
* vocabulary-parallel (``embed_tokens``, gpt-oss's ``embedding``, ``lm_head``): the *padded* vocabulary ``V_p``
  is split in row blocks of ``V_p / T`` (the local parameter's row count), ``rank = r // (V_p / T)``, local
  index ``= (r mod (V_p / T)) * C + c``; padding rows are never addressed.
* everything else (norms): replicated on every rank; written on all, read and hashed on rank 0.
* MoE experts that the engine repacked after loading into a blocked layout (vLLM's CPU expert kernels): every
  expert's slab ``[N, K]`` is permuted the same way, so loader element ``i = e * N * K + j`` lives at
  ``e * N * K + P[j]``; ``P`` is read off the engine's own packing function (:func:`slab_permutation`).

Every TP rank scatters its own slice in place; the base-version and digest check happens once for the
whole engine, in the client (:class:`~workers.vllm.engine.VllmWeightTarget`), against the sum of the ranks'
digest shares. The formulas are tested against vLLM's own weight loaders (``tests/vllm/test_shards.py``,
``tests/vllm/test_tp_loaders.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from aurora_store.codec.layout import InferenceTensor, ModelLayout
from aurora_store.errors import LayoutError

COLUMN_PARALLEL = ("qkv_proj", "gate_up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "embedding", "lm_head")  # "embedding": gpt-oss


@dataclass(frozen=True)
class Shard:
    """Which elements of one inference tensor a TP rank holds, and where in its local parameter.

    ``select`` maps sorted global flat indices to ``(positions, local indices)`` — positions into the input
    that this rank holds (``None`` when it holds all of them) and their flat indices in the local
    parameter. ``owner`` says whether this rank's elements count towards reads and the digest (replicas
    other than rank 0 do not).
    """

    numel: int
    local_numel: int
    owner: bool
    _select: Callable[[torch.Tensor], tuple[torch.Tensor | None, torch.Tensor]] | None = None
    _global: Callable[[], torch.Tensor] | None = None
    #: Repacked experts: the packed position, inside one expert's slab, of each loader-order element.
    permutation: torch.Tensor | None = field(default=None, compare=False)

    @property
    def full(self) -> bool:
        """This rank holds every element, each at its own flat index."""
        return self._select is None and self.permutation is None

    @property
    def whole(self) -> bool:
        """This rank holds every element (perhaps permuted: :attr:`permutation`)."""
        return self._select is None

    def select(self, indices: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        if self.permutation is not None:
            slab = self.permutation.numel()
            return None, indices - indices % slab + self.permutation[indices % slab]
        if self._select is None:
            return None, indices
        return self._select(indices)

    def loader_order(self, flat: torch.Tensor, expert: int) -> torch.Tensor:
        """Expert ``expert``'s slab of a permuted parameter's flat storage, in loader (codec) order (a copy)."""
        assert self.permutation is not None
        slab = self.permutation.numel()
        return flat[expert * slab: (expert + 1) * slab].index_select(0, self.permutation.to(flat.device))

    def global_indices(self) -> torch.Tensor:
        """Global flat index of every local element (sharded tensors only)."""
        if self._global is None:
            return torch.arange(self.numel, dtype=torch.int64)
        return self._global()


def shard_for(tensor: InferenceTensor, local_shape: Sequence[int], tp_rank: int, tp_size: int) -> Shard:
    """The :class:`Shard` of ``tensor`` that rank ``tp_rank`` of ``tp_size`` holds (see the module docs)."""
    local_numel = math.prod(local_shape)
    leaf = tensor.name.split(".")[-2]
    width = tensor.row_size
    if tp_size == 1:
        padded = leaf in VOCAB_PARALLEL and local_shape[0] >= tensor.shape[0]  # vLLM pads the vocabulary
        if tuple(local_shape) != tensor.shape and not (padded and tuple(local_shape[1:]) == tensor.shape[1:]):
            raise LayoutError(f"{tensor.name}: engine shape {tuple(local_shape)}, layout {tensor.shape}")
        return Shard(tensor.numel, local_numel, True)
    if leaf in COLUMN_PARALLEL:
        return _column_shard(tensor, local_shape, tp_rank, tp_size)
    if leaf in ROW_PARALLEL and len(tensor.shape) == 2:
        return _row_shard(tensor, local_shape, tp_rank, tp_size)
    if leaf in VOCAB_PARALLEL:
        rows = int(local_shape[0])
        lo = tp_rank * rows
        hi = min(lo + rows, tensor.shape[0])

        def select(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            row = idx // width
            pos = torch.nonzero((row >= lo) & (row < hi)).flatten()
            return pos, idx[pos] - lo * width

        return Shard(tensor.numel, local_numel, True, select,
                     lambda: torch.arange(lo * width, max(hi, lo) * width, dtype=torch.int64))
    if tuple(local_shape) != tensor.shape:
        raise LayoutError(f"{tensor.name}: replicated tensor has engine shape {tuple(local_shape)}")
    return Shard(tensor.numel, local_numel, tp_rank == 0)


def _column_shard(tensor: InferenceTensor, local_shape: Sequence[int], tp_rank: int, tp_size: int) -> Shard:
    width = tensor.row_size
    blocks = []  # (global first row, local first row, rows)
    local_row = 0
    for comp in tensor.components:
        if comp.rows % tp_size:
            raise LayoutError(f"{comp.train_name}: {comp.rows} rows do not split over {tp_size} ranks "
                              "(replicated KV heads are not supported yet)")
        rows = comp.rows // tp_size
        blocks.append((comp.row_offset + tp_rank * rows, local_row, rows))
        local_row += rows
    if local_row != local_shape[0]:
        raise LayoutError(f"{tensor.name}: engine holds {local_shape[0]} rows per rank, expected {local_row}")

    def select(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        row = idx // width
        keep = torch.zeros_like(idx, dtype=torch.bool)
        local = torch.empty_like(idx)
        for first, local_first, rows in blocks:
            hit = (row >= first) & (row < first + rows)
            keep |= hit
            local = torch.where(hit, idx + (local_first - first) * width, local)
        pos = torch.nonzero(keep).flatten()
        return pos, local[pos]

    def global_indices() -> torch.Tensor:
        return torch.cat([torch.arange(first * width, (first + rows) * width, dtype=torch.int64)
                          for first, _, rows in blocks])

    return Shard(tensor.numel, math.prod(local_shape), True, select, global_indices)


def _row_shard(tensor: InferenceTensor, local_shape: Sequence[int], tp_rank: int, tp_size: int) -> Shard:
    rows, width = tensor.shape
    cols = width // tp_size
    if width % tp_size or tuple(local_shape) != (rows, cols):
        raise LayoutError(f"{tensor.name}: engine shape {tuple(local_shape)} is not a column block of {tensor.shape}")
    lo = tp_rank * cols

    def select(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        row, col = idx // width, idx % width
        pos = torch.nonzero((col >= lo) & (col < lo + cols)).flatten()
        return pos, row[pos] * cols + (col[pos] - lo)

    def global_indices() -> torch.Tensor:
        r = torch.arange(rows, dtype=torch.int64)[:, None] * width
        return (r + torch.arange(lo, lo + cols, dtype=torch.int64)[None, :]).flatten()

    return Shard(tensor.numel, math.prod(local_shape), True, select, global_indices)


def bind_layout(layout: ModelLayout, params: Mapping[str, torch.Tensor], tp_rank: int,
                tp_size: int) -> tuple[dict[str, Shard], list[str]]:
    """Bind the codec layout to a worker's parameters: ``(shards, problems)`` (no problems = bound).
    Every layout tensor must be an engine parameter of the same dtype and a compatible shape, and every
    engine parameter must be in the layout — nothing may be left out of deltas and digests — or declared by it
    as engine-only (a constant, or derived from a layout tensor and refreshed after writes:
    :mod:`workers.vllm.derived`)."""
    declared = {e.name for e in layout.engine_only}
    problems = [f"engine parameter {n} is not in the layout" for n in params if n not in layout and n not in declared]
    problems += [f"engine-only tensor {n} is not an engine parameter" for n in sorted(declared) if n not in params]
    shards: dict[str, Shard] = {}
    for tensor in layout.tensors:
        param = params.get(tensor.name)
        if param is None:
            problems.append(f"layout tensor {tensor.name} is not an engine parameter")
            continue
        if str(param.dtype).removeprefix("torch.") != tensor.dtype:
            problems.append(f"{tensor.name}: engine dtype {param.dtype}, layout {tensor.dtype}")
            continue
        if not param.is_contiguous():
            problems.append(f"{tensor.name}: engine parameter is not contiguous")
            continue
        try:
            shards[tensor.name] = shard_for(tensor, tuple(param.shape), tp_rank, tp_size)
        except LayoutError as exc:
            problems.append(str(exc))
    return shards, problems


def slab_permutation(pack: Callable[[torch.Tensor], torch.Tensor], slab_shape: tuple[int, int]) -> torch.Tensor:
    """``P`` with ``packed[e, P[j]] = loader[e, j]`` (flat within one expert's slab of shape ``slab_shape``) for
    an engine's ``pack`` function of ``[E, N, K]`` bf16 tensors, read off ``pack`` itself: two experts' flat
    indices are packed one base-256 digit at a time (small integers are exact in bf16), and the result must be
    a permutation that is the same for every expert — anything else (arithmetic on the values, padding, mixing
    experts) raises :class:`~aurora_store.errors.LayoutError`, since a flat-index write could not address it."""
    rows, cols = slab_shape
    slab = rows * cols
    total = 2 * slab
    index = torch.arange(total, dtype=torch.int64)
    source = torch.zeros(total, dtype=torch.int64)  # loader index of each packed position
    for digit in range(max(1, math.ceil(math.log2(total) / 8))):
        probe = ((index >> (8 * digit)) & 255).to(torch.bfloat16).reshape(2, rows, cols)
        packed = pack(probe)
        if tuple(packed.shape) != (2, rows, cols):
            raise LayoutError(f"the engine packs a [2, {rows}, {cols}] expert tensor into {tuple(packed.shape)}")
        flat = packed.reshape(-1).float()
        if not bool(((flat >= 0) & (flat <= 255) & (flat == flat.round())).all()):
            raise LayoutError("the engine's expert packing changes values, not only their order")
        source |= flat.to(torch.int64) << (8 * digit)
    if not torch.equal(torch.sort(source).values, index) or not torch.equal(source[slab:], source[:slab] + slab):
        raise LayoutError(f"the engine's expert packing of [{rows}, {cols}] slabs is not one permutation per expert")
    position = torch.empty(slab, dtype=torch.int64)
    position[source[:slab]] = torch.arange(slab, dtype=torch.int64)
    return position


def permuted(shard: Shard, permutation: torch.Tensor) -> Shard:
    """``shard`` (a whole tensor at TP=1) with its experts' slabs permuted by ``permutation``."""
    if not shard.whole or shard.numel != shard.local_numel or shard.numel % max(permutation.numel(), 1):
        raise LayoutError("only a whole, unpadded expert tensor can be addressed through its packing")
    return replace(shard, permutation=permutation)
