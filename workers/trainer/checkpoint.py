"""The trainer's own checkpoint: fp32 master weights, optimizer state and counters.

Tensors go to safetensors and scalars to JSON (no pickle). A checkpoint is written to a temporary
directory and renamed into place, so a crash leaves either the old or the new one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


@dataclass(frozen=True)
class CheckpointInfo:
    step: int  # optimizer steps done
    version: int  # version the master weights correspond to (published or about to be)
    rewards: list  # mean reward per step so far
    rng_seed: int
    counters: dict = field(default_factory=dict)  # cumulative rollout counters, carried across restarts


def save(directory: str | Path, model, optimizer, info: CheckpointInfo) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".ckpt-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()
               if not _is_alias(model, k)}, str(tmp / "master.safetensors"))
    tensors, meta = {}, {"param_groups": optimizer.state_dict()["param_groups"], "state": {}}
    for index, state in optimizer.state_dict()["state"].items():
        entry = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tensors[f"{index}.{key}"] = value.contiguous()
            else:
                entry[key] = float(value)
        meta["state"][str(index)] = entry
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(meta))
    (tmp / "info.json").write_text(json.dumps(asdict(info)))
    final = directory / "latest"
    old = directory / ".ckpt-old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def exists(directory: str | Path) -> bool:
    return (Path(directory) / "latest" / "info.json").is_file()


def load(directory: str | Path, model, optimizer) -> CheckpointInfo:
    path = Path(directory) / "latest"
    state = load_file(str(path / "master.safetensors"))
    model.load_state_dict(state, strict=False)
    meta = json.loads((path / "optimizer.json").read_text())
    tensors = load_file(str(path / "optimizer.safetensors"))
    opt_state: dict = {"param_groups": meta["param_groups"], "state": {}}
    for index, scalars in meta["state"].items():
        entry = {k: torch.tensor(v) for k, v in scalars.items()}
        for key, value in tensors.items():
            i, name = key.split(".", 1)
            if i == index:
                entry[name] = value
        opt_state["state"][int(index)] = entry
    optimizer.load_state_dict(opt_state)
    return CheckpointInfo(**json.loads((path / "info.json").read_text()))


def _is_alias(model, key: str) -> bool:
    return key == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
