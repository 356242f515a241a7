"""Counting what crosses ranks: every torch.distributed collective (calls and tensor bytes), DTensor
``full_tensor``/``redistribute`` and FSDP ``unshard`` calls, while an :class:`Audit` is active.

Object collectives (``gather_object``, ``broadcast_object_list``) are counted as calls; the tensors they move
internally go through the patched tensor collectives and are counted as bytes there, once.
"""

from __future__ import annotations

import functools
from collections import Counter
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.tensor import DTensor

TENSOR_COLLECTIVES = ("all_gather", "all_gather_single", "all_gather_into_tensor", "all_gather_coalesced", "gather",
                      "broadcast", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "all_reduce",
                      "all_reduce_coalesced", "all_to_all_single", "all_to_all", "scatter", "reduce", "send", "recv",
                      "isend", "irecv", "batch_isend_irecv")
OBJECT_COLLECTIVES = ("gather_object", "all_gather_object", "broadcast_object_list", "scatter_object_list",
                      "send_object_list", "recv_object_list")


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class Audit:
    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.bytes: Counter = Counter()
        self.active = False

    def record(self, name: str, args, kwargs) -> None:
        if not self.active:
            return
        self.calls[name] += 1
        if name in TENSOR_COLLECTIVES:
            # the first tensor argument is what this rank contributes (or receives into)
            first = args[0] if args else next(iter(kwargs.values()), None)
            self.bytes[name] += _nbytes(first)

    @contextmanager
    def watching(self):
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    def as_json(self) -> dict:
        return {"calls": dict(self.calls), "bytes": dict(self.bytes)}


def install() -> Audit:
    """Patch torch.distributed (both namespaces), DTensor and FSDP once per process."""
    audit = Audit()
    for name in TENSOR_COLLECTIVES + OBJECT_COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue

        def wrapper(*args, __name=name, __original=original, **kwargs):
            audit.record(__name, args, kwargs)
            return __original(*args, **kwargs)

        functools.update_wrapper(wrapper, original)
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
    for owner, name in ((DTensor, "full_tensor"), (DTensor, "redistribute")):
        original = getattr(owner, name)

        def method(self, *args, __name=name, __original=original, **kwargs):
            audit.record(f"DTensor.{__name}", args, kwargs)
            return __original(self, *args, **kwargs)

        setattr(owner, name, method)
    from torch.distributed.fsdp import FSDPModule

    original_unshard = FSDPModule.unshard

    def unshard(self, *args, **kwargs):
        audit.record("FSDPModule.unshard", args, kwargs)
        return original_unshard(self, *args, **kwargs)

    FSDPModule.unshard = unshard
    return audit
