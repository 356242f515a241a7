"""The trainer's own checkpoint: every rank's rows of the fp32 master weights, its optimizer state and the
bf16 rows it last published, plus counters.

Tensors go to safetensors and scalars to JSON (no pickle). Each rank writes ``rank-0000r-of-0000W/`` into a
temporary directory; once all have (barrier), rank 0 adds ``info.json`` and renames the directory into
place, so a crash leaves either the old or the new checkpoint, never a mix of steps. The directory must be
shared by the ranks (one machine, or a shared filesystem). Resuming needs the same world size: the rows a
rank owns depend on it.

Keeping the published rows makes resuming local: nothing is rebuilt from the bucket, only checked against
it (the ranks' digest contributions must add up to the published version's ``weights_digest``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from aurora_store.codec.sharding import LocalRows
from aurora_store.errors import ConfigError
from workers.publish.ranks import Ranks
from workers.trainer.policy import ShardedPolicy

LATEST = "latest"
_TMP = ".ckpt-tmp"
_OLD = ".ckpt-old"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int  # optimizer steps done
    version: int  # version the master weights correspond to (published or about to be)
    rewards: list  # mean reward per step so far
    rng_seed: int
    counters: dict = field(default_factory=dict)  # cumulative rollout counters, carried across restarts
    world_size: int = 1  # ranks that wrote it (resuming needs as many)
    published_version: int = 0  # version of the saved published rows


def rank_dir(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}"


def save(directory: str | Path, policy: ShardedPolicy, optimizer: torch.optim.Optimizer, info: CheckpointInfo,
         ranks: Ranks) -> None:
    """Write this rank's shard; rank 0 swaps the complete checkpoint into place. Every rank must call it."""
    directory = Path(directory)
    tmp = directory / _TMP
    if ranks.leader:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    ranks.barrier()
    mine = tmp / rank_dir(ranks.rank, ranks.world)
    mine.mkdir()
    save_file({n: t.contiguous() for n, t in policy.master_rows().items()}, str(mine / "master.safetensors"))
    save_file({n: r.tensor.contiguous() for n, r in policy.published.items()}, str(mine / "published.safetensors"))
    tensors, meta = _optimizer_state(optimizer)
    save_file(tensors, str(mine / "optimizer.safetensors"))
    (mine / "optimizer.json").write_text(json.dumps(meta))
    (mine / "rows.json").write_text(json.dumps({n: [policy.starts[n], int(t.shape[0])]
                                                for n, t in policy.master_rows().items()}))
    ranks.barrier()
    if ranks.leader:
        (tmp / "info.json").write_text(json.dumps(asdict(info)))
        final, old = directory / LATEST, directory / _OLD
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    ranks.barrier()


def exists(directory: str | Path) -> bool:
    return (Path(directory) / LATEST / "info.json").is_file()


def load(directory: str | Path, policy: ShardedPolicy, optimizer: torch.optim.Optimizer,
         ranks: Ranks) -> tuple[CheckpointInfo, dict[str, LocalRows]]:
    """Restore this rank's master rows and optimizer state; return the info and the saved published rows."""
    path = Path(directory) / LATEST
    info = CheckpointInfo(**json.loads((path / "info.json").read_text()))
    if info.world_size != ranks.world:
        raise ConfigError(f"the checkpoint in {directory} was written by {info.world_size} rank(s); resume it with "
                          f"the same world size (torchrun --nproc-per-node {info.world_size}), not {ranks.world}")
    mine = path / rank_dir(ranks.rank, ranks.world)
    if not (mine / "master.safetensors").is_file():
        raise ConfigError(f"{mine} is missing: the checkpoint is incomplete or from an older trainer")
    layout_rows = json.loads((mine / "rows.json").read_text())
    expected = {n: [policy.starts[n], int(t.shape[0])] for n, t in policy.master_rows().items()}
    if layout_rows != expected:
        raise ConfigError(f"{mine} holds other rows than this rank owns (model or sharding changed)")
    master = load_file(str(mine / "master.safetensors"))
    with torch.no_grad():
        for name, local in policy.master_rows().items():
            local.copy_(master[name])
    _load_optimizer(optimizer, load_file(str(mine / "optimizer.safetensors")),
                    json.loads((mine / "optimizer.json").read_text()))
    published = policy.rows_of(load_file(str(mine / "published.safetensors")))
    return info, published


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Per-parameter state as local tensors (a DTensor's own shard) and scalars."""
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"param_groups": state_dict["param_groups"], "state": {}}
    for index, state in state_dict["state"].items():
        entry = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tensors[f"{index}.{key}"] = _local(value).contiguous()
            else:
                entry[key] = float(value)
        meta["state"][str(index)] = entry
    return tensors, meta


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Rebuild the state dict, wrapping each local shard back into a DTensor shaped like its parameter."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict = {"param_groups": meta["param_groups"], "state": {}}
    for index, scalars in meta["state"].items():
        entry: dict = {k: torch.tensor(v) for k, v in scalars.items()}
        state["state"][int(index)] = entry
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state["state"][int(index)][name] = _like(params[int(index)], value)
    optimizer.load_state_dict(state)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    local = local.to(_local(param).device)  # loaded on the host; the state lives where its parameter does
    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride(),
                              run_check=False)
