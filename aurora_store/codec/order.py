"""Element order: how a training tensor's elements are arranged in its block of an engine tensor when the
engine does not hold them in the trainer's storage order.

Most trainer tensors land in their engine tensor as they are stored: rows stacked, elements in storage order.
Some do not — transformers holds gpt-oss's experts as ``gate_up_proj`` ``[E, H, 2·I]`` and vLLM as ``w13``
``[E, 2·I, H]``, the transpose of each expert. An :class:`ElementOrder` says how: read the training tensor
(row-major, of its own ``shape``) as ``view`` — the same elements, its dims split further — and take the view's
axes in the order ``axes``; that, row-major, is the component's block of the engine tensor. A transpose of the
last two dims is ``view = shape``, ``axes = (0, 2, 1)``; splitting gate/up columns that alternate (``…, 2·I``)
into gate rows then up rows is ``view = (E, H, I, 2)``, ``axes = (0, 3, 2, 1)``.

Axis 0 is never moved or split (``axes[0] == 0``, ``view[0] == shape[0]``): every training row stays one row of
the engine block, so a rank that owns rows ``[start, stop)`` of the training tensor (FSDP) still owns one
contiguous flat range of the engine tensor, and can put its rows in engine order without seeing the others.

The position maps both ways (:meth:`ElementOrder.train_index`, :meth:`ElementOrder.engine_index`) are
arithmetic on the flat indices, never a table: the experts of one gpt-oss-120b layer hold 2.1·10⁹ elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aurora_store.codec import jsondoc
from aurora_store.errors import LayoutError


def _on_host_or_device(arithmetic: Callable[[Any], Any], indices: torch.Tensor) -> torch.Tensor:
    """``arithmetic`` (integer operators only) over int64 ``indices``: host indices through numpy, one
    single-threaded pass per operator (torch's would wake the intra-op thread pool for every one of them, which
    on a busy shared core costs more than the arithmetic); device indices where they are."""
    if indices.device.type == "cpu":
        result = arithmetic(indices.numpy().astype(np.int64, copy=False))
        return torch.from_numpy(np.asarray(result, dtype=np.int64))
    return arithmetic(indices.to(torch.int64))


def _strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides (in elements) of ``shape``."""
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * shape[k + 1]
    return tuple(out)


@dataclass(frozen=True)
class ElementOrder:
    """A training tensor of ``shape`` read as ``view`` with its axes taken in ``axes`` order (module docs)."""

    shape: tuple[int, ...]
    view: tuple[int, ...]
    axes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.shape or not self.view or any(d < 0 for d in (*self.shape, *self.view)):
            raise LayoutError(f"element order: invalid shape {self.shape} or view {self.view}")
        if math.prod(self.view) != math.prod(self.shape):
            raise LayoutError(f"element order: view {self.view} does not hold the {math.prod(self.shape)} "
                              f"elements of shape {self.shape}")
        if sorted(self.axes) != list(range(len(self.view))):
            raise LayoutError(f"element order: axes {self.axes} are not a permutation of the view's "
                              f"{len(self.view)} dims")
        if self.axes[0] != 0 or self.view[0] != self.shape[0]:
            raise LayoutError("element order: dim 0 (the rows) must stay first and whole "
                              f"(view {self.view}, axes {self.axes}, shape {self.shape})")
        if list(self.axes) == sorted(self.axes):
            # Storage order is spelled by leaving the order out: one layout, one document, one fingerprint.
            raise LayoutError(f"element order: axes {self.axes} keep storage order; leave the order out")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The view with its axes in ``axes`` order: the engine block's elements, row-major."""
        return tuple(self.view[a] for a in self.axes)

    # --- tensors ---------------------------------------------------------------------------------------

    def to_engine(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (all rows of the training tensor, or any run of them) in engine order, flat (a copy)."""
        return tensor.reshape((-1, *self.view[1:])).permute(self.axes).contiguous().reshape(-1)

    def to_train(self, block: torch.Tensor) -> torch.Tensor:
        """The training tensor (or a run of its rows) from its engine block (any shape, engine order)."""
        inverse = tuple(self.axes.index(k) for k in range(len(self.axes)))
        return block.reshape((-1, *self.block_shape[1:])).permute(inverse).reshape((-1, *self.shape[1:]))

    # --- positions -------------------------------------------------------------------------------------

    def train_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat storage index in the training tensor of each engine-order ``positions`` (int64, within the
        block: ``0 ≤ p < numel``)."""
        return _on_host_or_device(self._train_index, positions)

    def engine_index(self, indices: torch.Tensor) -> torch.Tensor:
        """Engine-order position within the block of each flat training storage index (the inverse of
        :meth:`train_index`)."""
        return _on_host_or_device(self._engine_index, indices)

    def _train_index(self, rest: Any) -> Any:
        # Unravel over the block's shape, last dim first; each digit steps by its view axis' storage stride.
        view_strides = _strides(self.view)
        out = 0
        for k in range(len(self.axes) - 1, 0, -1):
            size = self.block_shape[k]
            out = out + (rest % size) * view_strides[self.axes[k]]
            rest = rest // size
        return out + rest * view_strides[0]  # axis 0 is the rows, in place

    def _engine_index(self, rest: Any) -> Any:
        block_strides = _strides(self.block_shape)
        where = {axis: k for k, axis in enumerate(self.axes)}
        out = 0
        for axis in range(len(self.view) - 1, 0, -1):
            out = out + (rest % self.view[axis]) * block_strides[where[axis]]
            rest = rest // self.view[axis]
        return out + rest * block_strides[0]

    # --- document --------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, list[int]]:
        return {"shape": list(self.shape), "view": list(self.view), "axes": list(self.axes)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ElementOrder:
        if not isinstance(doc, Mapping) or set(doc) != {"shape", "view", "axes"}:
            raise LayoutError(f"element order must be an object with shape, view and axes: {str(doc)[:120]}")
        lists = []
        for key in ("shape", "view", "axes"):
            value = doc[key]
            if not isinstance(value, list):
                raise LayoutError(f"element order {key} must be a list of integers")
            lists.append(tuple(jsondoc.integer(d, f"element order {key}", LayoutError) for d in value))
        return cls(*lists)
