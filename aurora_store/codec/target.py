"""Weight targets: the tensors a delta is applied to, seen through the inference layout's flat indices.

A target maps each inference tensor onto one or more contiguous flat pieces of real storage — the fused
tensor itself (vLLM-style), or the separate q/k/v and gate/up tensors of a HuggingFace model — so the same
decoded delta scatters into either without building full-shape staging tensors. It also tracks which
version its weights are at and their additive digest.

:class:`WeightTarget` is the interface staging and activation use; :class:`TensorTarget` implements it over
torch tensors in this process, and an inference engine implements it over its own parameters (the vLLM
engine's target reaches them through ``collective_rpc``). A target that can cut a write's indices at its
storage ahead of time also implements :class:`SupportsScatterPlan`, which staging uses when it is there.
``aurora_store.testing.targets.WeightTargetConformance`` is the contract as tests.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from aurora_store.codec import kernels
from aurora_store.codec.digest import WeightsDigest, digest_pieces
from aurora_store.codec.layout import InferenceTensor, ModelLayout, bits_view
from aurora_store.codec.order import ElementOrder
from aurora_store.errors import LayoutError


@dataclass(frozen=True)
class _Piece:
    lo: int
    hi: int
    bits: torch.Tensor  # flat int16 view sharing storage with the real parameter
    # The training tensor's element order when it is not the engine's (gpt-oss's transposed experts): a
    # position in the piece is then mapped to its storage index, never by a table.
    order: ElementOrder | None = None

    def storage(self, positions: torch.Tensor) -> torch.Tensor:
        """Storage indices in ``bits`` of engine-order ``positions`` within the piece."""
        return positions if self.order is None else self.order.train_index(positions)

    def engine_bits(self) -> torch.Tensor:
        """The piece's bits in engine order (the view itself, or a copy)."""
        return self.bits if self.order is None else self.order.to_engine(self.bits)


@dataclass(frozen=True)
class ScatterPlan:
    """One tensor's writes cut at its storage pieces ahead of time (piece-local indices, already on the
    weights' device), so activating is one ``scatter_`` per piece and nothing else. Made while staging, for
    the target that made it."""

    # The target it was made for (held, so its identity cannot be reused): activating on any other target
    # falls back to scatter().
    owner: object
    parts: tuple[tuple[int, torch.Tensor, slice], ...]  # (piece number, local indices, slice of the bits)


@dataclass(frozen=True)
class HostStorage:
    """One tensor's pieces as host arrays, for a reader that places its own reads (staging reads the old bits
    of each decoded chunk straight from here: the chunk's range says which piece it lies in, so its indices
    are cut only where it spans two pieces)."""

    starts: tuple[int, ...]  # flat index of each piece's first element, ascending (the first is 0)
    bits: tuple[np.ndarray, ...]  # each piece's flat int16 storage, in engine order (shares the weights' memory)

    def piece(self, index: int) -> int:
        """The number of the piece holding flat ``index`` (of the tensor, known to be in range)."""
        return bisect_right(self.starts, index) - 1


@runtime_checkable
class WeightTarget(Protocol):
    """Flat-index access to the weights of one model, plus its version and digest — what staging reads
    (current bits under changed indices) and activation writes.

    Writes: :meth:`scatter` MAY queue (a target in another process sends its writes in one batch);
    :meth:`flush` makes every queued write visible. Reads of a queued write before the flush may see the old
    or the new bits. :func:`~aurora_store.codec.activate` always flushes, so an activated version is visible.

    ``version`` is ``None`` until the caller declares which published version the weights hold (and again
    after a flush failed: the weights are then unknown, and no delta applies to them); ``digest`` is the
    additive weights digest of what the target holds (kept current by :func:`~aurora_store.codec.activate`,
    not recomputed).

    Bad input — a tensor name not in the layout, an index outside ``[0, numel)``, a count or dtype mismatch —
    raises a typed :class:`~aurora_store.errors.AuroraError` (at the call, or at the flush for a queued write)
    and leaves the weights as they were.
    """

    layout: ModelLayout
    version: int | None
    digest: WeightsDigest

    def gather(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        """Current bit patterns (int16) at sorted flat ``indices`` of inference tensor ``name``."""
        ...

    def gather_many(self, requests: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """:meth:`gather` for several tensors at once (one round trip for a target in another process)."""
        ...

    def scatter(self, name: str, indices: torch.Tensor, bits: torch.Tensor) -> None:
        """Write ``bits`` (int16) at sorted flat ``indices`` of inference tensor ``name`` in place, now or at
        the next :meth:`flush`."""
        ...

    def flush(self) -> None:
        """Make every queued write visible (a no-op when nothing is queued, or for a target that writes at
        :meth:`scatter`)."""
        ...

    def element(self, name: str, index: int) -> int:
        """One element's bit pattern."""
        ...

    def full_digest(self) -> WeightsDigest:
        """From-scratch digest of the current weights (O(model size))."""
        ...

    def fused_bits(self, name: str) -> torch.Tensor:
        """A copy of inference tensor ``name``'s bits, flat."""
        ...


@runtime_checkable
class SupportsScatterPlan(Protocol):
    """A target that can do the value-independent half of a write ahead: staging plans each tensor's
    scatter (:meth:`plan_scatter`) and activation then writes with :meth:`scatter_planned` — on the
    batch boundary only the writes themselves remain."""

    def plan_scatter(self, name: str, indices: torch.Tensor) -> ScatterPlan:
        """A plan for writing at sorted flat ``indices`` of ``name``; its ``owner`` is this target."""
        ...

    def scatter_planned(self, name: str, plan: ScatterPlan, bits: torch.Tensor) -> None:
        """:meth:`WeightTarget.scatter` with the indices of a plan this target made."""
        ...


def check_indices(layout: ModelLayout, name: str, indices: torch.Tensor) -> InferenceTensor:
    """``name``'s tensor, or a :class:`~aurora_store.errors.LayoutError` when ``name`` is not in the layout or
    an index lies outside ``[0, numel)`` — checked before anything is read or written."""
    tensor = layout[name]
    if indices.numel():
        # Host indices through numpy: one single-threaded pass each, no intra-op thread pool to wake.
        flat = indices.numpy() if indices.device.type == "cpu" else indices
        if int(flat.min()) < 0 or int(flat.max()) >= tensor.numel:
            raise LayoutError(f"{name}: flat index out of range [0, {tensor.numel})")
    return tensor


def check_values(name: str, indices: torch.Tensor, bits: torch.Tensor) -> None:
    """A write carries one int16 bit pattern per index."""
    if indices.numel() != bits.numel() or bits.dtype != torch.int16:
        raise LayoutError(f"{name}: scatter needs one int16 value per index")


class TensorTarget:
    """A :class:`WeightTarget` over torch tensors of this process (fused or training-layout parameters).

    ``version`` is ``None`` until the caller declares which published version the weights hold.
    """

    def __init__(self, layout: ModelLayout, pieces: Mapping[str, list[_Piece]],
                 version: int | None = None, digest: WeightsDigest | None = None) -> None:
        self.layout = layout
        self._pieces = dict(pieces)
        for tensor in layout.tensors:
            spans = self._pieces.get(tensor.name)
            if not spans:
                raise LayoutError(f"target has no storage for {tensor.name}")
            covered = 0
            for piece in spans:
                if piece.lo != covered or piece.bits.numel() != piece.hi - piece.lo:
                    raise LayoutError(f"{tensor.name}: target pieces must tile the tensor in order")
                covered = piece.hi
            if covered != tensor.numel:
                raise LayoutError(f"{tensor.name}: target covers {covered} of {tensor.numel} elements")
        self._bounds = {name: [p.lo for p in spans] for name, spans in self._pieces.items()}
        self._ordered = {name for name, spans in self._pieces.items() if any(p.order for p in spans)}
        self._host = {name: HostStorage(tuple(p.lo for p in spans), tuple(p.bits.detach().numpy() for p in spans))
                      for name, spans in self._pieces.items()
                      if name not in self._ordered and all(p.bits.device.type == "cpu" for p in spans)}
        self.version = version
        self.digest = digest if digest is not None else self.full_digest()

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_state(cls, layout: ModelLayout, state: Mapping[str, torch.Tensor], **kw) -> TensorTarget:
        """Over training-layout tensors (e.g. a HuggingFace model's parameters)."""
        layout.check_state(state)
        pieces: dict[str, list[_Piece]] = {}
        for tensor in layout.tensors:
            spans = []
            for comp in tensor.components:
                lo, hi = tensor.component_span(comp)
                spans.append(_Piece(lo, hi, _writable_bits(state[comp.train_name], comp.train_name), comp.order))
            pieces[tensor.name] = spans
        return cls(layout, pieces, **kw)

    # --- access ----------------------------------------------------------------------------------

    def _split(self, name: str, indices: torch.Tensor) -> list[tuple[_Piece, torch.Tensor, slice]]:
        """``(piece, storage indices in it, slice of the input)`` for sorted flat ``indices`` of ``name``."""
        parts = self._cut(name, indices)
        if name in self._ordered:
            return [(piece, piece.storage(local), where) for piece, local, where in parts]
        return parts

    def _cut(self, name: str, indices: torch.Tensor) -> list[tuple[_Piece, torch.Tensor, slice]]:
        spans = self._pieces[name]
        if len(spans) == 1:
            return [(spans[0], indices, slice(None))]
        # indices are sorted: cut them at the piece boundaries (host indices with numpy: one thread per pass).
        out = []
        if indices.device.type == "cpu":
            flat = indices.numpy()
            cuts = [0, *np.searchsorted(flat, [p.lo for p in spans[1:]]).tolist(), flat.size]
            for piece, a, b in zip(spans, cuts[:-1], cuts[1:]):
                if b > a:  # the first piece's positions are the indices themselves: a view, not a copy
                    local = flat[a:b] if piece.lo == 0 else flat[a:b] - piece.lo
                    out.append((piece, torch.from_numpy(local), slice(a, b)))
            return out
        bounds = torch.tensor([p.lo for p in spans[1:]], dtype=indices.dtype, device=indices.device)
        cuts = [0, *torch.searchsorted(indices, bounds).tolist(), indices.numel()]
        for piece, a, b in zip(spans, cuts[:-1], cuts[1:]):
            if b > a:
                out.append((piece, indices[a:b] - piece.lo, slice(a, b)))
        return out

    def gather(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        """Current bit patterns at sorted flat ``indices`` of inference tensor ``name``, on the host (only the
        requested elements leave the weights' device)."""
        check_indices(self.layout, name, indices)
        out = torch.empty(indices.numel(), dtype=torch.int16)
        for piece, local, where in self._split(name, indices):
            if piece.bits.device.type == "cpu" and local.device.type == "cpu":
                # Compiled, one thread, no pool: the indices were checked against the tensor and cut at the piece.
                kernels.take16(piece.bits.detach().numpy(), local.numpy(), out.numpy()[where])
            else:
                out[where] = piece.bits[local.to(piece.bits.device)].cpu()
        return out

    def gather_many(self, requests: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """:meth:`gather` for several tensors at once (a target in another process answers in one round trip)."""
        return [self.gather(name, indices) for name, indices in requests]

    def host_storage(self, name: str) -> HostStorage | None:
        """``name``'s pieces as host arrays when every piece is in host memory in engine order, else None
        (read those with :meth:`gather`). Reads and writes through them bypass every check: the caller
        keeps its indices inside the tensor."""
        self.layout[name]
        return self._host.get(name)

    def plan_scatter(self, name: str, indices: torch.Tensor, *, in_range: bool = False) -> ScatterPlan:
        """Cut sorted flat ``indices`` at this target's pieces and move them to the weights' device: the work
        of :meth:`scatter` that does not depend on the values, done ahead (while staging). ``in_range``: the
        caller vouches the indices lie in the tensor (staging's are checked as they are decoded), so the
        check's two passes over them are skipped."""
        if in_range:
            self.layout[name]
        else:
            check_indices(self.layout, name, indices)
        spans = self._pieces[name]
        parts = []
        for piece, local, where in self._split(name, indices):
            parts.append((spans.index(piece), local.to(piece.bits.device), where))
        return ScatterPlan(self, tuple(parts))

    def scatter_planned(self, name: str, plan: ScatterPlan, bits: torch.Tensor) -> None:
        """:meth:`scatter` with the indices already cut and placed by :meth:`plan_scatter`."""
        if plan.owner is not self:
            raise LayoutError(f"{name}: the scatter plan was made for another target")
        spans = self._pieces[name]
        for number, local, where in plan.parts:
            piece = spans[number]
            piece.bits.scatter_(0, local, bits[where].to(piece.bits.device))

    def scatter(self, name: str, indices: torch.Tensor, bits: torch.Tensor) -> None:
        """Write ``bits`` at sorted flat ``indices`` in place, on the weights' device: only the indices and
        bits travel there, never a copy of the weights. Everything is checked before the first piece is
        written, so a refused write changes nothing."""
        check_indices(self.layout, name, indices)
        check_values(name, indices, bits)
        for piece, local, where in self._split(name, indices):
            device = piece.bits.device
            # scatter_ rather than index_copy_: same writes (indices are unique), 3-4x faster on the CPU.
            piece.bits.scatter_(0, local.to(device), bits[where].to(device))

    def flush(self) -> None:
        """Nothing to do: :meth:`scatter` writes the tensors of this process in place at once."""

    def element(self, name: str, index: int) -> int:
        check_indices(self.layout, name, torch.tensor([index]))
        spans = self._pieces[name]
        piece = spans[bisect_right(self._bounds[name], index) - 1]
        return int(piece.bits[piece.storage(torch.tensor([index - piece.lo]))[0]])

    def full_digest(self) -> WeightsDigest:
        """From-scratch digest of the current weights (O(model size))."""
        return digest_pieces((name, p.lo, p.engine_bits()) for name, spans in self._pieces.items() for p in spans)

    def fused_bits(self, name: str) -> torch.Tensor:
        """A copy of inference tensor ``name``'s bits, flat, on the host (for checks and tests)."""
        self.layout[name]
        return torch.cat([p.engine_bits().cpu() for p in self._pieces[name]])


def _writable_bits(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise LayoutError(f"{name}: target tensors must be contiguous to be updated in place")
    return bits_view(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor)
