"""The policy as one rank holds it: its rows of the fp32 master weights and the bf16 rows it last published.

Under ``torchrun`` every decoder layer and the model root are wrapped with FSDP2's ``fully_shard``, which
shards each parameter on dim 0 (``torch.chunk``-style), so a rank owns rows ``[start, stop)`` of every
training tensor as a plain local tensor (``DTensor.to_local()``). Everything the trainer does to the
weights between optimizer steps — casting to bf16, diffing against what was published, hashing,
checkpointing — works on those local rows, so no rank ever materialises a parameter it does not own. With
one rank the model is left as it is (no process group) and the local rows are the whole tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.sharding import LocalRows, even_rows
from aurora_store.errors import ConfigError, LayoutError
from workers.publish.ranks import Ranks

COMPUTE_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class ShardedPolicy:
    """This rank's view of the policy. ``published`` holds the bf16 rows of the last published version."""

    model: nn.Module
    layout: ModelLayout
    ranks: Ranks
    params: dict[str, nn.Parameter]  # training name → parameter (a DTensor sharded on dim 0 when sharded)
    starts: dict[str, int]  # training name → first row this rank owns
    published: dict[str, LocalRows] = field(default_factory=dict)

    @classmethod
    def shard(cls, model: nn.Module, layout: ModelLayout, ranks: Ranks, *,
              compute_dtype: str = "bfloat16", device: torch.device | None = None) -> ShardedPolicy:
        """Make every rank hold rank 0's weights, then shard them (a no-op with one rank).

        Rank 0's weights win so that anything done to them before sharding (the warm start) happens once.
        ``compute_dtype`` is FSDP2's ``param_dtype``: parameters are all-gathered in it for forward/backward,
        gradients are reduced in fp32 and the master shards stay fp32 either way. ``device`` is where the
        model goes: sharded, it arrives there shard by shard (:func:`shard_onto`) from wherever it is (the host);
        with one rank it must already be there.
        """
        if ranks.sharded:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            if compute_dtype not in COMPUTE_DTYPES:
                raise ConfigError(f"unknown compute dtype {compute_dtype!r}; choose from {sorted(COMPUTE_DTYPES)}")
            policy = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[compute_dtype], reduce_dtype=torch.float32)
            shard_onto(model, ranks, device or torch.device("cpu"), policy)
        # Keep the sharded parameter objects: FSDP2 swaps unsharded views into the modules during forward.
        named = dict(model.named_parameters())
        # The guard against silent name-mapping gaps: every trainable parameter must be shipped and every
        # layout tensor must have a source, or no step is ever published (LayoutCoverageError names them).
        layout.check_coverage([n for n, p in named.items() if p.requires_grad], held=named)
        params = {n: named[n] for n in layout.train_names}
        starts = {}
        for name, param in params.items():
            rows = int(param.shape[0])
            start, stop = even_rows(rows, ranks.rank, ranks.world)
            local = _local(param)
            if int(local.shape[0]) != stop - start:
                raise LayoutError(f"{name}: rank {ranks.rank} holds {local.shape[0]} rows, expected rows "
                                  f"[{start}, {stop}) of {rows} (FSDP sharding changed?)")
            starts[name] = start
        return cls(model, layout, ranks, params, starts)

    def master_rows(self) -> dict[str, torch.Tensor]:
        """This rank's fp32 rows of every training tensor (views: writes go to the master weights)."""
        return {name: _local(param) for name, param in self.params.items()}

    def cast_rows(self) -> dict[str, LocalRows]:
        """The bf16 cast of this rank's master rows: its share of the policy actors will run."""
        return {name: LocalRows(name, self.starts[name], _local(param).to(torch.bfloat16).contiguous())
                for name, param in self.params.items()}

    def cast_rows_lazily(self) -> Mapping[str, LocalRows]:
        """The same rows as :meth:`cast_rows`, each cast only when asked for (the delta encoder takes one tensor
        at a time), so publishing never holds a second bf16 copy of the policy beside :attr:`published`."""
        return _CastRows(self)

    def refresh_published(self) -> None:
        """Overwrite :attr:`published` in place with the master's bf16 cast, one tensor at a time (after a
        publish has encoded the difference): one bf16 copy of the policy exists, never two."""
        with torch.no_grad():
            for name, param in self.params.items():
                self.published[name].tensor.copy_(_local(param).to(torch.bfloat16))

    def rows_of(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, LocalRows]:
        """Wrap per-name local tensors (e.g. loaded from a checkpoint) with this rank's row offsets."""
        return {name: LocalRows(name, self.starts[name], tensors[name].to(_local(self.params[name]).device))
                for name in self.params}


class _CastRows(Mapping[str, LocalRows]):
    def __init__(self, policy: ShardedPolicy) -> None:
        self.policy = policy

    def __getitem__(self, name: str) -> LocalRows:
        param = self.policy.params[name]
        return LocalRows(name, self.policy.starts[name], _local(param).to(torch.bfloat16).contiguous())

    def __iter__(self) -> Iterator[str]:
        return iter(self.policy.params)

    def __len__(self) -> int:
        return len(self.policy.params)


def frozen_reference(model: nn.Module, ranks: Ranks, device: torch.device | None = None) -> nn.Module:
    """A frozen bf16 copy of ``model`` (call it with the initial weights, before the policy is sharded): the
    reference policy of GRPO's KL term. Every rank gets rank 0's weights; under FSDP the copy is sharded
    exactly like the policy (every decoder layer and the root), so each rank holds 1/W of a bf16 copy —
    a quarter of the fp32 master's memory per rank — and its forward all-gathers layer by layer."""
    reference = copy.deepcopy(model).to(torch.bfloat16)  # where the (host) model is; bf16 bits of its fp32
    reference.requires_grad_(False)
    reference.eval()
    if ranks.sharded:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        shard_onto(reference, ranks, device or torch.device("cpu"), MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        reference.requires_grad_(False)
    elif device is not None:
        reference.to(device)
    return reference


def shard_onto(model: nn.Module, ranks: Ranks, device: torch.device, mp_policy) -> None:
    """Shard ``model`` (whole, on the host) over the ranks onto ``device`` without ever holding it whole there:
    its parameters move to the meta device, every decoder layer and the root get ``fully_shard``, the empty
    shards are allocated on ``device``, then each parameter is filled in turn from rank 0's host copy (one
    full tensor on the device at a time, broadcast, its rows ``[start, stop)`` kept). The result is bit for bit
    what sharding the whole model after broadcasting it from rank 0 gives, at 1/W of the device memory."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    host = {name: param.data for name, param in model.named_parameters()}  # tied weights once
    buffers = {name: buf.data for name, buf in model.named_buffers()}  # e.g. rotary frequencies
    uses: dict[int, list[tuple[nn.Module, str]]] = {}  # each parameter's (module, attribute) uses: ties
    for module in model.modules():
        for attr, param in module.named_parameters(recurse=False):
            uses.setdefault(id(param), []).append((module, attr))
    model.to("meta")  # new parameters (host → meta cannot swap data in place); ``host`` keeps the values
    for tied in (u for u in uses.values() if len(u) > 1):  # e.g. a tied head: one parameter again
        first = getattr(*tied[0])
        for module, attr in tied[1:]:
            setattr(module, attr, first)
    # An explicit mesh: FSDP2's default one takes the machine's accelerator even for a CPU run.
    mesh = init_device_mesh(device.type, (ranks.world,))
    for layer in getattr(getattr(model, "model", None), "layers", []):
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = host.pop(name).to(device)
            dist.broadcast(full, src=0)  # rank 0's weights win (its warm start happened once, there)
            start, stop = even_rows(int(full.shape[0]), ranks.rank, ranks.world)
            local = _local(param)
            if int(local.shape[0]) != stop - start:
                raise LayoutError(f"{name}: rank {ranks.rank} holds {local.shape[0]} rows, expected rows "
                                  f"[{start}, {stop}) (FSDP sharding changed?)")
            local.copy_(full[start:stop])
            del full
        for name, buf in model.named_buffers():
            buf.copy_(buffers[name])


def _local(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (param.to_local() if isinstance(param, DTensor) else param).detach()
