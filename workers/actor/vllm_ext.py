"""Runs inside vLLM's worker process: flat-index reads and in-place writes of the engine's own parameters.

vLLM mixes :class:`AuroraWorkerExtension` into its worker class when an engine is created with
``worker_extension_cls="workers.actor.vllm_ext.AuroraWorkerExtension"``; the actor then reaches these methods
with ``LLM.collective_rpc("aurora_…")``, which works the same whether the engine core runs in the actor's
process or (V1 multiprocessing, the default) in a process of its own. Every method works on vLLM's inference
tensors (``…qkv_proj.weight``, ``…gate_up_proj.weight``) addressed by the codec's fused flat index, so a
delta is scattered straight into the storage the kernels read: no reload, no full-shape staging tensor, no
copy of the weights.

Wire format. vLLM's msgpack transport rebuilds tensors only for typed fields, and ``collective_rpc``'s
``args`` are untyped, so tensors would arrive as opaque lists; everything therefore crosses the process
boundary as plain ``bytes`` (little-endian int32/int64 indices, int16 bit patterns), strings and lists.

Tensor parallelism. Each worker (TP rank) receives the *global* flat indices and keeps the ones it holds
(:class:`Shard`), so the client side does not change when TP > 1 is enabled. How a global flat index
``i = r * C + c`` (row ``r``, column ``c``, ``C`` = row size) of a tensor maps to ``(rank, local index)``
with ``T`` ranks:

* column-parallel (``qkv_proj``, ``gate_up_proj``, and their biases): every component ``k`` (rows
  ``[o_k, o_k + R_k)`` of the fused tensor) is split in ``T`` row blocks of ``R_k / T``; rank ``t`` stacks
  its blocks in component order, so ``rank = (r - o_k) // (R_k / T)`` and the local row is
  ``Σ_{j<k} R_j / T + (r - o_k) mod (R_k / T)``; local index ``= local_row * C + c``. (When there are fewer KV
  heads than ranks vLLM replicates KV heads; that case is refused until it is implemented.)
* row-parallel (``o_proj``, ``down_proj``): columns are split, ``rank = c // (C / T)``, local index
  ``= r * (C / T) + c mod (C / T)``.
* vocabulary-parallel (``embed_tokens``, ``lm_head``): the *padded* vocabulary ``V_p`` is split in row
  blocks of ``V_p / T`` (the local parameter's row count), ``rank = r // (V_p / T)``, local index
  ``= (r mod (V_p / T)) * C + c``; padding rows are never addressed.
* everything else (norms): replicated on every rank; written on all, read and hashed on rank 0.

Every TP rank scatters its own slice in place; the base-version and digest check happens once for the
whole engine, in the client (:class:`~workers.actor.engine_vllm.VllmWeightTarget`), against the sum of the
ranks' digest shares. The formulas are tested against vLLM's own weight loaders (``tests/vllm/test_shards.py``).

CPU backend. vLLM's CPU build repacks linear weights into oneDNN's blocked layout after loading and frees
the originals (the tied ``lm_head`` GEMM gets a packed *copy* of the embedding), so writes to the
parameters would never reach the kernels. Importing this module (which vLLM does in the worker before it
builds the model) therefore selects vLLM's own fallback GEMM on CPU — ``torch.nn.functional.linear`` on the
parameter itself — for engines that use this extension. GPU builds use unquantized parameters as they are.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aurora_store.codec.digest import ZERO, WeightsDigest, hash_elements, hash_range
from aurora_store.codec.layout import InferenceTensor, ModelLayout
from aurora_store.errors import LayoutError

#: Method names reached through ``collective_rpc`` (all prefixed so they cannot clash with vLLM's worker).
RPC_ATTACH = "aurora_attach"
RPC_GATHER = "aurora_gather"
RPC_SCATTER = "aurora_scatter"
RPC_DIGEST = "aurora_digest"
RPC_READ = "aurora_read"
RPC_PARAMETERS = "aurora_parameters"

COLUMN_PARALLEL = ("qkv_proj", "gate_up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


# --- wire helpers ------------------------------------------------------------------------------------


def pack_indices(indices: torch.Tensor) -> tuple[str, bytes]:
    """Sorted int64 flat indices as bytes; int32 when they fit (6 instead of 10 bytes per changed element)."""
    last = int(indices[-1]) if indices.numel() else 0
    if last < 2**31:
        return "i4", indices.to(torch.int32).numpy().tobytes()
    return "i8", indices.to(torch.int64).numpy().tobytes()


def unpack_indices(kind: str, data: bytes) -> torch.Tensor:
    dtype = {"i4": np.int32, "i8": np.int64}.get(kind)
    if dtype is None:
        raise LayoutError(f"unknown index encoding {kind!r}")
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).astype(np.int64))


def unpack_bits(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy())


# --- shards ------------------------------------------------------------------------------------------


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

    @property
    def full(self) -> bool:
        return self._select is None

    def select(self, indices: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        if self._select is None:
            return None, indices
        return self._select(indices)

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


# --- CPU backend: keep the parameters the live weights ------------------------------------------------


#: The worker extension's import path (``worker_extension_cls``) and the weight-transfer backend's name: an
#: engine configured with either keeps its CPU weights addressable.
EXTENSION_PATH = "workers.actor.vllm_ext.AuroraWorkerExtension"
BACKEND_NAME = "aurora"


def engine_uses_aurora() -> bool:
    """Whether the vLLM engine being built (the current vLLM config) updates its weights through Aurora:
    either this worker extension or the ``aurora`` weight-transfer backend. Without a current config (model
    code called outside an engine) the answer is yes, as before the backend existed."""
    from vllm.config.vllm import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        return True
    transfer = getattr(config, "weight_transfer_config", None)
    return (config.parallel_config.worker_extension_cls == EXTENSION_PATH
            or (transfer is not None and transfer.backend == BACKEND_NAME))


def keep_cpu_weights_addressable() -> None:
    """On vLLM's CPU backend, make unquantized linear layers (and the tied LM head) of engines that update
    weights through Aurora (:func:`engine_uses_aurora`) compute from their parameters instead of a repacked
    copy, so in-place writes reach the kernels; other engines in the same process keep vLLM's packed GEMM.
    Idempotent; a no-op on other platforms. Runs before the model is built: vLLM imports this module first
    (worker extension), or the ``aurora`` plugin imports it when vLLM loads its general plugins."""
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(layer_utils.dispatch_cpu_unquantized_gemm, "_aurora", False):
        return
    original = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.ndim != 2 or weight.is_meta or not engine_uses_aurora():
            original(layer, remove_weight)
            return
        # vLLM's own fallback path; keeps layer.weight. torch types Module.__setattr__ as Tensor | Module only,
        # but vLLM stores a callable in this attribute.
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]

    dispatch._aurora = True  # type: ignore[attr-defined]
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def register_backend() -> None:
    """Register the ``aurora`` weight-transfer backend with vLLM (lazily: its module is imported only when an
    engine is built with it). Idempotent. The ``vllm.general_plugins`` entry point calls this in every vLLM
    process of an installed package; importing this module (the worker extension) does too, so engines built
    with the extension find the backend even where the package's entry points are not installed."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND_NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND_NAME, "workers.integrations.vllm_backend",
                                                    "AuroraWeightTransferEngine")


with contextlib.suppress(ImportError):  # importable without vLLM (e.g. for the shard maths alone)
    keep_cpu_weights_addressable()
    register_backend()


# --- the scatter core (shared by the worker extension and the ``aurora`` weight-transfer backend) -------


def flat_bits(params: dict[str, torch.nn.Parameter], name: str, shard: Shard) -> torch.Tensor:
    """The parameter's storage as flat int16 bits. ``params`` is looked up afresh for every call, so that a
    parameter replaced by the engine (e.g. by a full reload) is never written through a stale view."""
    param = params[name]
    if param.numel() != shard.local_numel or not param.is_contiguous():
        raise LayoutError(f"{name}: engine parameter changed shape or layout since attach")
    return param.data.view(-1).view(torch.int16)


def bind_layout(layout: ModelLayout, params: dict[str, torch.nn.Parameter], tp_rank: int,
                tp_size: int) -> tuple[dict[str, Shard], list[str]]:
    """Bind the codec layout to a worker's parameters: ``(shards, problems)`` (no problems = bound).
    Every layout tensor must be an engine parameter of the same dtype and a compatible shape, and every
    engine parameter must be in the layout — nothing may be left out of deltas and digests."""
    problems = [f"engine parameter {n} is not in the layout" for n in params if n not in layout]
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


def gather_local(layout: ModelLayout, shards: dict[str, Shard], params: dict[str, torch.nn.Parameter], name: str,
                 indices: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(positions or None, bits)`` of the elements at sorted global ``indices`` of ``name`` that this rank
    holds (``None`` = all of them, in order; a replica that is not the owner returns no elements)."""
    shard = shards[layout[name].name]
    flat = flat_bits(params, name, shard)
    positions, local = shard.select(indices)
    if not shard.owner:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int16)
    _check_bounds(name, local, shard.numel if shard.full else shard.local_numel)
    return positions, flat.index_select(0, local.to(flat.device)).cpu()


def scatter_in_place(layout: ModelLayout, shards: dict[str, Shard], params: dict[str, torch.nn.Parameter],
                     updates: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> int:
    """Write ``(name, sorted global flat indices, int16 bits)`` updates into this rank's parameters in place;
    returns elements written. Everything is validated before the first write, so a bad update leaves the
    weights untouched."""
    plan = []
    for name, indices, bits in updates:
        shard = shards[layout[name].name]
        if indices.numel() != bits.numel():
            raise LayoutError(f"{name}: {indices.numel()} indices but {bits.numel()} values")
        positions, local = shard.select(indices)
        if positions is not None:
            bits = bits[positions]
        _check_bounds(name, local, shard.numel if shard.full else shard.local_numel)
        plan.append((flat_bits(params, name, shard), local, bits))
    written = 0
    with torch.no_grad():
        for flat, local, bits in plan:
            # index_put_ rather than index_copy_: ~2.5x faster on CPU; indices are unique (strictly
            # increasing, checked when the delta was decoded), so the write order does not matter.
            flat.index_put_((local.to(flat.device),), bits.to(flat.device))
            written += local.numel()
    return written


def digest_local(layout: ModelLayout, shards: dict[str, Shard], params: dict[str, torch.nn.Parameter]) -> WeightsDigest:
    """This rank's share of the weights digest (the whole digest at TP=1), hashed from scratch."""
    total = ZERO
    for tensor in layout.tensors:
        shard = shards[tensor.name]
        if not shard.owner:
            continue
        # Hashed where the parameter lives (torch ops on the GPU): no host copy of the weights.
        flat = flat_bits(params, tensor.name, shard)
        if shard.full:
            total = total + hash_range(tensor.name, 0, flat[: tensor.numel])
        else:
            glob = shard.global_indices()
            total = total + hash_elements(tensor.name, glob, flat[: glob.numel()])
    return total


def read_local(layout: ModelLayout, shards: dict[str, Shard], params: dict[str, torch.nn.Parameter],
               name: str) -> torch.Tensor:
    """A copy of the full flat bits of ``name`` (TP=1; for checks and tests — O(tensor size))."""
    return flat_bits(params, name, shards[name])[: layout[name].numel].cpu().clone()


# --- the extension ------------------------------------------------------------------------------------


class AuroraWorkerExtension:
    """Mixed into vLLM's worker class; every public method is a ``collective_rpc`` target."""

    def _aurora_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _aurora_tp(self) -> tuple[int, int]:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()

    def _aurora_bound(self) -> tuple[ModelLayout, dict[str, Shard]]:
        state = getattr(self, "_aurora_state", None)
        if state is None:
            raise LayoutError("no layout attached: call aurora_attach first")
        return state

    def _aurora_params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self._aurora_model().named_parameters())

    def aurora_parameters(self) -> list[list[Any]]:
        """``[name, shape, dtype]`` of every engine parameter, as vLLM names them."""
        return [[n, list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in self._aurora_params().items()]

    def aurora_attach(self, layout_doc: dict[str, Any]) -> list[str]:
        """Bind the codec layout to this worker's parameters (:func:`bind_layout`); returns the problems
        found (empty = bound)."""
        layout = ModelLayout.from_json(layout_doc)
        shards, problems = bind_layout(layout, self._aurora_params(), *self._aurora_tp())
        if not problems:
            self._aurora_state = (layout, shards)
        return problems

    def aurora_gather(self, requests: list[list[Any]]) -> list[list[bytes | None]]:
        """For each ``[name, index_kind, index_bytes]``: ``[positions or None, bits]`` of the requested
        elements this rank holds (``None`` = all of them, in order)."""
        layout, shards = self._aurora_bound()
        params = self._aurora_params()
        out: list[list[bytes | None]] = []
        for name, kind, data in requests:
            positions, bits = gather_local(layout, shards, params, name, unpack_indices(kind, data))
            out.append([None if positions is None else positions.numpy().tobytes(), bits.numpy().tobytes()])
        return out

    def aurora_scatter(self, updates: list[list[Any]]) -> int:
        """Write ``[name, index_kind, index_bytes, bits_bytes]`` updates in place (:func:`scatter_in_place`);
        returns elements written."""
        layout, shards = self._aurora_bound()
        return scatter_in_place(layout, shards, self._aurora_params(),
                                [(name, unpack_indices(kind, data), unpack_bits(bits))
                                 for name, kind, data, bits in updates])

    def aurora_digest(self) -> str:
        """This rank's share of the weights digest (the whole digest at TP=1), hashed from scratch."""
        layout, shards = self._aurora_bound()
        return str(digest_local(layout, shards, self._aurora_params()))

    def aurora_read(self, names: list[str]) -> list[bytes]:
        """Full flat bits of the named tensors (TP=1; for checks and tests — O(tensor size))."""
        layout, shards = self._aurora_bound()
        if any(not shards[n].full for n in names):
            raise LayoutError("aurora_read needs TP=1; read sharded tensors with aurora_gather")
        params = self._aurora_params()
        return [read_local(layout, shards, params, n).numpy().tobytes() for n in names]


def _check_bounds(name: str, local: torch.Tensor, limit: int) -> None:
    if local.numel() and (int(local.min()) < 0 or int(local.max()) >= limit):
        raise LayoutError(f"{name}: flat index out of range [0, {limit})")


def merge_gathered(count: int, replies: Iterable[list[bytes | None]]) -> torch.Tensor:
    """Assemble one request's ``[positions, bits]`` replies from every rank into ``count`` bit patterns."""
    out = torch.empty(count, dtype=torch.int16)
    for positions, data in replies:
        bits = unpack_bits(data or b"")
        if positions is None:
            out.copy_(bits)
        elif bits.numel():
            out[torch.from_numpy(np.frombuffer(positions, dtype=np.int64).copy())] = bits
    return out


def sum_digests(replies: Iterable[str]) -> WeightsDigest:
    total = ZERO
    for reply in replies:
        total = total + WeightsDigest.parse(reply)
    return total
