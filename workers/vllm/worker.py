"""Runs inside vLLM's worker process: flat-index reads and in-place writes of the engine's own parameters.

Two ways in, one scatter core (:func:`gather_local`, :func:`scatter_in_place`, :func:`digest_local`):

* :class:`AuroraWorkerExtension` — vLLM mixes it into its worker class when an engine is created with
  ``worker_extension_cls=EXTENSION_PATH``; our engine client (:mod:`workers.vllm.engine`) reaches its
  methods with ``LLM.collective_rpc("aurora_…")``, which works the same whether the engine core runs in the
  caller's process or (V1 multiprocessing, the default) in a process of its own;
* :class:`ModelTarget` — a :class:`~aurora_store.codec.WeightTarget` over the worker's parameters, which
  the ``aurora`` weight-transfer backend (:mod:`workers.vllm.backend`) stages against and writes through.

Every method works on vLLM's inference tensors (``…qkv_proj.weight``, ``…gate_up_proj.weight``) addressed by
the codec's fused flat index (TP ranks: :mod:`workers.vllm.shards`), so a delta is scattered straight into
the storage the kernels read: no reload, no full-shape staging tensor, no copy of the weights. On vLLM's
CPU backend that holds only because the ``aurora`` plugin selects vLLM's fallback GEMM
(:func:`workers.vllm.backend.keep_cpu_weights_addressable`); binding checks it (:func:`packed_layers`). Its MoE
experts are repacked after loading into a blocked layout, a fixed permutation of each expert's elements that
binding reads off vLLM's own packing function (:func:`repacked_experts`), so writes, reads and digests of those
tensors go through it: the kernels' copy is the only copy, updated in place. Tensors vLLM derives from a written
tensor after loading (MLA's absorbed ``W_UK_T`` / ``W_UV`` from ``kv_b_proj``) are recomputed after each write by
the rule the layout names (:mod:`workers.vllm.derived`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from aurora_store.codec.digest import ZERO, WeightsDigest, hash_elements, hash_range
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.target import check_indices, check_values
from aurora_store.errors import BaseVersionMismatchError, LayoutError
from workers.vllm.derived import bind_refreshes
from workers.vllm.held import HeldStager, StageRequest, write_slice
from workers.vllm.shards import Shard, bind_layout, permuted, slab_permutation
from workers.vllm.wire import unpack_indices

Params = Mapping[str, torch.Tensor]
Update = tuple[str, torch.Tensor, torch.Tensor]  # (name, sorted global flat indices, int16 bits)


# --- the scatter core ----------------------------------------------------------------------------------


def flat_bits(params: Params, name: str, shard: Shard) -> torch.Tensor:
    """The parameter's storage as flat int16 bits. ``params`` is looked up afresh for every call, so that a
    parameter replaced by the engine (e.g. by a full reload) is never written through a stale view."""
    param = params[name]
    if param.numel() != shard.local_numel or not param.is_contiguous():
        raise LayoutError(f"{name}: engine parameter changed shape or layout since attach")
    return param.data.view(-1).view(torch.int16)


def gather_local(layout: ModelLayout, shards: Mapping[str, Shard], params: Params, name: str,
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


def scatter_in_place(layout: ModelLayout, shards: Mapping[str, Shard], params: Params,
                     updates: Iterable[Update]) -> int:
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


def digest_local(layout: ModelLayout, shards: Mapping[str, Shard], params: Params) -> WeightsDigest:
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
        elif shard.permutation is not None:
            # One expert's slab at a time back in loader order: a slab-sized copy, never the whole tensor.
            slab = shard.permutation.numel()
            for expert in range(tensor.numel // slab):
                total = total + hash_range(tensor.name, expert * slab, shard.loader_order(flat, expert))
        else:
            glob = shard.global_indices()
            total = total + hash_elements(tensor.name, glob, flat[: glob.numel()])
    return total


def read_local(layout: ModelLayout, shards: Mapping[str, Shard], params: Params, name: str) -> torch.Tensor:
    """A copy of the full flat bits of ``name`` (TP=1; for checks and tests — O(tensor size))."""
    tensor = layout[name]
    shard = shards[tensor.name]
    flat = flat_bits(params, name, shard)
    if shard.permutation is not None:
        slab = shard.permutation.numel()
        return torch.cat([shard.loader_order(flat, e) for e in range(tensor.numel // slab)]).cpu()
    return flat[: tensor.numel].cpu().clone()


def _check_bounds(name: str, local: torch.Tensor, limit: int) -> None:
    if local.numel() and (int(local.min()) < 0 or int(local.max()) >= limit):
        raise LayoutError(f"{name}: flat index out of range [0, {limit})")


def packed_layers(model: torch.nn.Module) -> list[str]:
    """Layers that vLLM's CPU backend computes from a repacked copy of their weight (oneDNN's blocked layout;
    the tied LM head's packed copy of the embedding): in-place writes to the parameter would never reach
    them. Empty when the ``aurora`` plugin selected the fallback GEMM, and on other platforms."""
    linear = torch.nn.functional.linear
    return [name for name, module in model.named_modules()
            if getattr(module, "cpu_linear", linear) is not linear]


def repacked_experts(model: torch.nn.Module) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Expert parameters (``…w13_weight``, ``…w2_weight``) that vLLM's CPU backend computes from a copy it
    repacked after loading (``CPUUnquantizedExperts.process_weights_after_loading`` →
    ``cpu_prepack_moe_weight``, unless it chose zentorch), each with the packing function it used: same shape,
    elements permuted, so a write at a codec flat index goes through that permutation
    (:func:`~workers.vllm.shards.slab_permutation`). Empty on other platforms and kernels."""
    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE kernels
        return {}
    found: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and not getattr(experts, "_use_zentorch", False):
            isa = experts.isa

            def pack(weight: torch.Tensor, isa: str = isa) -> torch.Tensor:
                return cpu_prepack_moe_weight(weight, isa)

            for param in ("w13_weight", "w2_weight"):
                found[f"{name}.{param}" if name else param] = pack
    return found


def bind_model(layout: ModelLayout, model: torch.nn.Module, tp_rank: int, tp_size: int
               ) -> tuple[dict[str, Shard], list[str]]:
    """:func:`~workers.vllm.shards.bind_layout` over a worker's model, plus :func:`packed_layers` and the
    experts' packings (:func:`repacked_experts`): ``(shards, problems)`` (no problems = every layout tensor is
    addressable in place)."""
    params = dict(model.named_parameters())
    shards, problems = bind_layout(layout, params, tp_rank, tp_size)
    problems += bind_refreshes(layout, model)[1]
    problems += [f"{name}: vLLM computes this layer from a repacked copy of its weight, so in-place writes "
                 "would not reach it (the aurora vllm.general_plugins entry point selects vLLM's fallback GEMM "
                 "on CPU: is aurora-rl installed where vLLM runs, and not excluded by VLLM_PLUGINS?)"
                 for name in packed_layers(model)]
    permutations: dict[tuple[int, int], torch.Tensor] = {}  # one probe per slab shape, shared by all layers
    for name, pack in repacked_experts(model).items():
        shard = shards.get(name)
        if shard is None:  # its mismatch is reported by bind_layout; say what usually causes it
            problems.append(f"{name}: repacked experts that do not match the layout cannot be addressed in place "
                            "(vLLM's CPU MoE kernels zero-pad an expert size that is not a multiple of their block "
                            "before repacking)")
            continue
        try:
            if tp_size != 1:
                raise LayoutError("repacked experts are addressed at TP=1 only")
            _, rows, cols = params[name].shape
            shape = (int(rows), int(cols))
            if shape not in permutations:
                permutations[shape] = slab_permutation(pack, shape)
            shards[name] = permuted(shard, permutations[shape])
        except LayoutError as exc:
            problems.append(f"{name}: vLLM's CPU MoE backend repacked it after loading and {exc}")
    return shards, problems


# --- the backend's weight target -------------------------------------------------------------------------


class ModelTarget:
    """:class:`~aurora_store.codec.WeightTarget` over a vLLM worker's own parameters (one TP rank).

    Reads go straight to the parameters; :meth:`scatter` queues and :meth:`flush` writes everything queued
    with one :func:`scatter_in_place` call, which validates every update before the first write. ``written``
    counts the elements written so far. ``held`` stages versions in this worker ahead of their activation
    (:mod:`workers.vllm.held`); every write here drops what it held, which was staged on the old weights.
    """

    def __init__(self, layout: ModelLayout, model: torch.nn.Module, shards: Mapping[str, Shard],
                 version: int | None = None) -> None:
        self.layout = layout
        self._model = model
        self._shards = dict(shards)
        self._pending: list[Update] = []
        self.written = 0
        self.held = HeldStager()
        self.version = version
        self.digest = self.full_digest()
        # Problems were reported when binding (bind_model); here only what to refresh after a write.
        self._refreshes = bind_refreshes(layout, model)[0]
        self.refreshed = 0  # modules whose derived tensors were recomputed so far

    @classmethod
    def bind(cls, layout: ModelLayout, model: torch.nn.Module, tp: tuple[int, int] = (0, 1), *,
             version: int | None = None, what: str = "the layout") -> ModelTarget:
        """Bind ``layout`` to ``model``'s parameters (rank ``tp[0]`` of ``tp[1]``); a
        :class:`~aurora_store.errors.LayoutError` lists what does not match."""
        shards, problems = bind_model(layout, model, *tp)
        if problems:
            raise LayoutError(f"vLLM's parameters do not match {what}: {'; '.join(problems[:8])}")
        return cls(layout, model, shards, version=version)

    def _params(self) -> dict[str, torch.Tensor]:
        return dict(self._model.named_parameters())

    def _flats(self) -> Callable[[str], torch.Tensor]:
        """Flat bits by name over the parameters as they are now (one lookup of the model's parameters)."""
        params = self._params()
        return lambda name: flat_bits(params, name, self._shards[self.layout[name].name])

    # --- reads -------------------------------------------------------------------------------------

    def gather(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        positions, bits = gather_local(self.layout, self._shards, self._params(), name, indices)
        if positions is not None:  # TP > 1 is refused at bind time; a partial answer is a bug
            raise LayoutError(f"{name}: this rank holds only part of the tensor")
        return bits

    def gather_many(self, requests: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        return [self.gather(name, indices) for name, indices in requests]

    def element(self, name: str, index: int) -> int:
        return int(self.gather(name, torch.tensor([index], dtype=torch.int64))[0])

    def full_digest(self) -> WeightsDigest:
        return digest_local(self.layout, self._shards, self._params())

    def fused_bits(self, name: str) -> torch.Tensor:
        return read_local(self.layout, self._shards, self._params(), name)

    # --- writes ------------------------------------------------------------------------------------

    def scatter(self, name: str, indices: torch.Tensor, bits: torch.Tensor) -> None:
        check_indices(self.layout, name, indices)
        check_values(name, indices, bits)
        self._pending.append((name, indices, bits))

    def flush(self) -> None:
        updates, self._pending = self._pending, []
        if updates:
            self.write(updates)

    def write(self, updates: Iterable[Update]) -> int:
        """Write ``updates`` now (validated before the first write; not queued); returns elements written.
        The caller keeps ``version`` and ``digest`` right."""
        self.held.wrote()  # before the first write: a staging reading old bits now is never written
        updates = list(updates)
        written = scatter_in_place(self.layout, self._shards, self._params(), updates)
        self.written += written
        self._refresh(name for name, indices, _ in updates if indices.numel())
        return written

    def _refresh(self, written: Iterable[str]) -> None:
        """Recompute what the engine derived from the written tensors (before the engine computes again)."""
        self.refreshed += self._refreshes.after_write(self._model, written)

    # --- versions staged in this worker ------------------------------------------------------------

    def stage_held(self, request: StageRequest) -> None:
        """Start staging ``request``'s version in the background (only on the version this worker is at)."""
        if request.manifest.base_version != self.version:
            raise BaseVersionMismatchError(f"version {request.manifest.version} has base "
                                           f"{request.manifest.base_version}, this worker is at {self.version}")
        self.held.start(request, self.layout, self._shards, self._flats())

    def declare(self, version: int, digest: WeightsDigest) -> None:
        """The weights are at ``version`` (``digest``): the engine's side checked them from scratch after a
        bootstrap, which loads a snapshot without telling the workers which. Nothing is written; what this
        worker held was staged on other weights and is dropped."""
        self.held.wrote()
        self.version, self.digest = version, digest

    def write_held(self, version: int, base_version: int) -> tuple[int, float]:
        """Write the held ``version`` in place if it was staged on ``base_version``, the version this worker
        is at, with no write since; returns ``(elements written, seconds of the scatter itself)``."""
        if base_version != self.version:
            raise BaseVersionMismatchError(f"activating {version} on {base_version}, this worker is at {self.version}")
        held = self.held.take(version, base_version)
        written, seconds = write_slice(self._flats(), held)
        self._refresh(name for name, local, _ in held.writes if local.numel())
        self.written += written
        self.version, self.digest = version, WeightsDigest.parse(held.weights_digest)
        return written, seconds

    @property
    def pending(self) -> int:
        return len(self._pending)


# --- the worker extension ----------------------------------------------------------------------------------


class AuroraWorkerExtension:
    """Mixed into vLLM's worker class; every public method is a ``collective_rpc`` target (wire format:
    :mod:`workers.vllm.wire`)."""

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

    def _aurora_params(self) -> dict[str, torch.Tensor]:
        return dict(self._aurora_model().named_parameters())

    def aurora_parameters(self) -> list[list[Any]]:
        """``[name, shape, dtype]`` of every engine parameter, as vLLM names them."""
        return [[n, list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in self._aurora_params().items()]

    def aurora_attach(self, layout_doc: dict[str, Any]) -> list[str]:
        """Bind the codec layout to this worker's parameters (:func:`bind_model`); returns the problems found
        (empty = bound)."""
        layout = ModelLayout.from_json(layout_doc)
        shards, problems = bind_model(layout, self._aurora_model(), *self._aurora_tp())
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

    def aurora_digest(self) -> str:
        """This rank's share of the weights digest (the whole digest at TP=1), hashed from scratch."""
        layout, shards = self._aurora_bound()
        return str(digest_local(layout, shards, self._aurora_params()))

    def _aurora_target(self) -> ModelTarget:
        """The ``aurora`` backend's target in this worker (it tracks the version and every write)."""
        target = getattr(getattr(self, "weight_transfer_engine", None), "target", None)
        if not isinstance(target, ModelTarget):
            raise LayoutError("the aurora backend is not initialised in this worker")
        return target

    def aurora_stage(self, request: list[Any]) -> None:
        """Start staging a verified version from its bucket in the background (:mod:`workers.vllm.held`);
        returns at once, so the engine keeps generating."""
        self._aurora_target().stage_held(StageRequest.from_wire(request))

    def aurora_staged(self, version: int) -> list[Any] | None:
        """``None`` while ``version`` stages here; then ``[version, held, owned, digest share, seconds]``."""
        return self._aurora_target().held.poll(version)

    def aurora_declare(self, version: int, digest: str) -> None:
        """Record the version and digest the weights are at (see :meth:`ModelTarget.declare`)."""
        self._aurora_target().declare(int(version), WeightsDigest.parse(digest))

    def aurora_activate(self, version: int, base_version: int) -> list[float]:
        """The batch boundary: write the held ``version`` in place; ``[elements written, scatter seconds]``."""
        written, seconds = self._aurora_target().write_held(version, base_version)
        return [written, seconds]

    def aurora_read(self, names: list[str]) -> list[bytes]:
        """Full flat bits of the named tensors (TP=1; for checks and tests — O(tensor size))."""
        layout, shards = self._aurora_bound()
        if any(not shards[layout[n].name].whole for n in names):
            raise LayoutError("aurora_read needs TP=1; read sharded tensors with aurora_gather")
        params = self._aurora_params()
        return [read_local(layout, shards, params, n).numpy().tobytes() for n in names]
