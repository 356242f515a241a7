"""The trainer's own checkpoint: every rank's rows of the fp32 master weights and its optimizer state, plus
counters — written every N steps, in the background, in one copy on disk where the disk asks for it.

**What is not in it.** The bf16 rows the trainer last published are not saved: they are the bucket's, and
a resume rebuilds them from a snapshot and the deltas after it and checks them against the manifest's
``weights_digest`` (:mod:`.rebuild`). That also lets a checkpoint be older than the bucket's latest
version: after a crash k steps past the last checkpoint, the trainer restarts from the checkpoint's master
weights and publishes its next version on top of the latest published one (the chain never forks).

**Layout.** ``<dir>/step-SSSSSSSS/rank-0000r-of-0000W/`` (``master.safetensors``, ``optimizer.safetensors``,
``optimizer.json``, ``rows.json``) and ``info.json``; tensors in safetensors, scalars in JSON (no pickle).
A step's checkpoint is *complete* once ``info.json`` and every rank's directory exist; loading takes the
newest complete one, so a crash mid-write leaves the previous one in charge. Each rank writes its shard
into a hidden temporary directory, fsyncs its files, renames it into place and fsyncs the directory, so
a rank's shard is either whole or absent. The directory must be shared by the ranks (one machine, or a
shared filesystem); resuming needs the same world size (the rows a rank owns depend on it).

**Asynchronous.** :meth:`Checkpoints.submit` copies this rank's tensors into host staging buffers (reused
from one checkpoint to the next; on a GPU this is the only part the step waits for) and hands them to a
writer thread; the training loop goes on. The next ``submit`` first waits until the previous checkpoint
is durable, so at most one write is in flight and checkpoints land in step order. The writer never takes
part in a collective (it only touches files), so it cannot interleave with the training step's.

**One copy.** A new checkpoint is written beside the previous one, which rank 0's writer deletes as soon
as the new one is complete: two copies exist only while a write is under way. Where the disk cannot hold
two (:func:`plan_disk`), each writer deletes its previous shard *before* writing the new one: one copy
at any time, at the price of a window during each write in which no complete checkpoint exists (a crash
there leaves the trainer refusing to start over a bucket that already has versions; it never forks).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from aurora_store.errors import ConfigError, DiskBudgetError
from workers.publish.ranks import Ranks
from workers.trainer.policy import ShardedPolicy

log = logging.getLogger("aurora.trainer")

_STEP = "step-"
_LEGACY = "latest"  # the single directory of the trainer before checkpoints were written every N steps
#: Bytes per parameter of the optimizer's state, by ``--optimizer`` (Adam's two moments); unknown: fp32's.
MOMENT_BYTES = {"adamw": 8, "adamw-bf16": 4}
#: Head room kept free beyond the checkpoints themselves (JSON files, filesystem slack).
DISK_MARGIN_BYTES = 64 << 20
#: The default interval writes at most this many checkpoint bytes per step on average (:func:`default_every`).
BYTES_PER_STEP = 1 << 30
MAX_DEFAULT_EVERY = 50


@dataclass(frozen=True)
class CheckpointInfo:
    step: int  # optimizer steps done
    version: int  # version the master weights correspond to (published, or about to be when it was written)
    rewards: list  # mean reward per step so far
    rng_seed: int
    counters: dict = field(default_factory=dict)  # cumulative rollout counters, carried across restarts
    world_size: int = 1  # ranks that wrote it (resuming needs as many)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CheckpointInfo:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def rank_dir(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}"


def step_dir(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"{_STEP}{step:08d}"


def _steps(directory: Path) -> list[int]:
    """Every step that has a checkpoint directory (complete or not), oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        if child.name.startswith(_STEP) and child.name[len(_STEP):].isdigit() and child.is_dir():
            found.append(int(child.name[len(_STEP):]))
    return sorted(found)


def _complete(path: Path) -> CheckpointInfo | None:
    """The info of the checkpoint in ``path`` if every rank's shard is there, else ``None``."""
    try:
        info = CheckpointInfo.from_json(json.loads((path / "info.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    shards = all((path / rank_dir(r, info.world_size) / "rows.json").is_file() for r in range(info.world_size))
    return info if shards else None


def latest_step(directory: str | Path) -> int | None:
    """The newest step with a complete checkpoint in ``directory``."""
    for step in reversed(_steps(Path(directory))):
        if _complete(step_dir(directory, step)) is not None:
            return step
    return None


def exists(directory: str | Path) -> bool:
    """A checkpoint to resume from (an old-format one counts: loading it says why it cannot be used)."""
    return latest_step(directory) is not None or (Path(directory) / _LEGACY / "info.json").is_file()


def bytes_on_disk(directory: str | Path) -> int:
    """Bytes of every checkpoint file under ``directory`` (complete or not)."""
    total = 0
    for step in _steps(Path(directory)):
        for root, _, files in os.walk(step_dir(directory, step)):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


# --- how much disk, how often ---------------------------------------------------------------------


def estimate_bytes(parameters: int, optimizer: str) -> int:
    """One checkpoint's bytes for ``parameters`` parameters: fp32 master + the optimizer's moments."""
    return parameters * (4 + MOMENT_BYTES.get(optimizer, 8))


@dataclass(frozen=True)
class DiskPlan:
    checkpoint_bytes: int  # one checkpoint, all ranks
    available_bytes: int  # free on the checkpoint directory's filesystem + what checkpoints there already use
    keep_previous: bool  # two copies fit: the new one is written beside the previous one

    @property
    def needed_bytes(self) -> int:
        return (2 if self.keep_previous else 1) * self.checkpoint_bytes + DISK_MARGIN_BYTES


def plan_disk(directory: str | Path, checkpoint_bytes: int) -> DiskPlan:
    """Whether ``directory``'s filesystem holds two checkpoints (written beside each other), one (written in
    place of each other), or none: :class:`DiskBudgetError` naming the bytes needed and free."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    existing = bytes_on_disk(path)
    available = free + existing
    if available >= 2 * checkpoint_bytes + DISK_MARGIN_BYTES:
        return DiskPlan(checkpoint_bytes, available, keep_previous=True)
    if available >= checkpoint_bytes + DISK_MARGIN_BYTES:
        return DiskPlan(checkpoint_bytes, available, keep_previous=False)
    needed = checkpoint_bytes + DISK_MARGIN_BYTES
    raise DiskBudgetError(f"the checkpoint directory {path} has {free} bytes free (+ {existing} in checkpoints "
                          f"already there); one checkpoint (fp32 master + optimizer state) needs {checkpoint_bytes} "
                          f"bytes, {needed} with head room: free space or point --checkpoint-dir elsewhere",
                          needed=needed, free=available)


def default_every(plan: DiskPlan) -> int:
    """``--checkpoint-every``'s default: write at most :data:`BYTES_PER_STEP` (1 GiB) of checkpoint per step on
    average — ``ceil(checkpoint_bytes / 1 GiB)``, at least 1 and at most 50 — and twice as rarely where only one
    copy fits (each write then opens a window without a complete checkpoint). A small model checkpoints every
    step; Qwen3-0.6B (7.2 GB with fp32 moments) every 7; an 8B model every 50."""
    every = max(1, min(MAX_DEFAULT_EVERY, math.ceil(plan.checkpoint_bytes / BYTES_PER_STEP)))
    return every if plan.keep_previous else min(MAX_DEFAULT_EVERY, 2 * every)


# --- writing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Staged:
    step: int
    info: CheckpointInfo
    master: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]
    optimizer_meta: dict
    rows: dict[str, list[int]]


class Checkpoints:
    """This rank's checkpoints: every ``every`` steps, written by a background thread (see the module)."""

    def __init__(self, directory: str | Path, ranks: Ranks, *, every: int = 1, keep_previous: bool = True,
                 complete_timeout_s: float = 3600.0) -> None:
        if every < 1:
            raise ConfigError(f"checkpoints must be written every N ≥ 1 steps, not {every}")
        self.directory = Path(directory)
        self.ranks = ranks
        self.every = every
        self.keep_previous = keep_previous
        self.complete_timeout_s = complete_timeout_s  # rank 0 waits this long for the other ranks' shards
        self.last_step: int | None = None  # newest step submitted
        self._staging: dict[str, torch.Tensor] = {}  # host buffers, reused by every checkpoint
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written: list[dict[str, float]] = []  # per checkpoint: step, staging and write seconds, bytes

    @classmethod
    def plan(cls, directory: str | Path, ranks: Ranks, policy: ShardedPolicy, optimizer: str,
             every: int | None) -> Checkpoints:
        """Check the disk budget (rank 0; every rank raises the same :class:`DiskBudgetError`) and choose the
        interval: ``every`` if given, else :func:`default_every`."""
        local = sum(t.numel() for t in policy.master_rows().values())
        counts = ranks.gather(local, "checkpoint_bytes")
        verdict: dict[str, Any] | None = None
        if counts is not None:
            try:
                disk = plan_disk(directory, estimate_bytes(sum(counts), optimizer))
                verdict = {"bytes": disk.checkpoint_bytes, "available": disk.available_bytes,
                           "keep": disk.keep_previous, "every": every or default_every(disk)}
            except DiskBudgetError as exc:
                verdict = {"error": str(exc), "needed": exc.needed, "free": exc.free}
        verdict = ranks.broadcast(verdict, "checkpoint_plan")
        assert verdict is not None
        if "error" in verdict:
            raise DiskBudgetError(verdict["error"], needed=verdict["needed"], free=verdict["free"])
        log.info("checkpoints", extra={"every": verdict["every"], "bytes": verdict["bytes"],
                                       "available_bytes": verdict["available"], "keep_previous": verdict["keep"]})
        if not verdict["keep"]:
            log.warning("the checkpoint disk holds one checkpoint, not two: each one is written in place of the "
                        "previous (a crash during a write leaves none)")
        return cls(directory, ranks, every=int(verdict["every"]), keep_previous=bool(verdict["keep"]))

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def submit(self, policy: ShardedPolicy, optimizer: torch.optim.Optimizer, info: CheckpointInfo) -> None:
        """Stage this rank's shard at ``info.step`` and write it in the background. Waits first for the
        previous checkpoint to be durable (and raises its error, if it failed)."""
        self.wait()
        t0 = time.monotonic()
        master = {f"master/{n}": t for n, t in policy.master_rows().items()}
        tensors, meta = _optimizer_state(optimizer)
        staged = _Staged(info.step, info, self._stage(master, "master/"),
                         self._stage({f"optim/{k}": v for k, v in tensors.items()}, "optim/"), meta,
                         {n: [policy.starts[n], int(t.shape[0])] for n, t in policy.master_rows().items()})
        staging_s = time.monotonic() - t0
        self.last_step = info.step
        self._thread = threading.Thread(target=self._write, args=(staged, staging_s),
                                        name=f"checkpoint-{info.step}")
        self._thread.start()

    def save(self, policy: ShardedPolicy, optimizer: torch.optim.Optimizer, info: CheckpointInfo) -> None:
        """:meth:`submit` and wait until it is durable."""
        self.submit(policy, optimizer, info)
        self.wait()

    def wait(self) -> None:
        """Until the checkpoint in flight (if any) is durable; re-raises its writer's error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _stage(self, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """Host copies of ``tensors`` (keys without ``prefix``) in this rank's reused staging buffers."""
        out = {}
        for key, tensor in tensors.items():
            buffer = self._staging.get(key)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = self._staging[key] = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
            buffer.copy_(tensor.detach())
            out[key[len(prefix):]] = buffer
        return out

    def _write(self, staged: _Staged, staging_s: float) -> None:
        try:
            t0 = time.monotonic()
            nbytes = self._write_shard(staged)
            if self.ranks.leader:
                self._commit(staged)
            self.written.append({"step": staged.step, "staging_s": staging_s, "write_s": time.monotonic() - t0,
                                 "bytes": nbytes})
        except BaseException as exc:  # handed to the training thread at its next submit or wait
            self._error = exc

    def _write_shard(self, staged: _Staged) -> int:
        ranks = self.ranks
        if not self.keep_previous:  # one copy on disk: make room first
            for step in _steps(self.directory):
                if step != staged.step:
                    if ranks.leader:
                        (step_dir(self.directory, step) / "info.json").unlink(missing_ok=True)
                    shutil.rmtree(step_dir(self.directory, step) / rank_dir(ranks.rank, ranks.world),
                                  ignore_errors=True)
        where = step_dir(self.directory, staged.step)
        where.mkdir(parents=True, exist_ok=True)
        final = where / rank_dir(ranks.rank, ranks.world)
        tmp = where / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # a previous attempt at this step (a restart redid it)
        tmp.mkdir()
        save_file(staged.master, str(tmp / "master.safetensors"))
        save_file(staged.optimizer, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(staged.optimizer_meta))
        (tmp / "rows.json").write_text(json.dumps(staged.rows))  # written last: marks the shard whole
        nbytes = 0
        for child in tmp.iterdir():
            nbytes += _fsync(child)
        _fsync_dir(tmp)
        os.replace(tmp, final)
        _fsync_dir(where)
        _fsync_dir(self.directory)
        return nbytes

    def _commit(self, staged: _Staged) -> None:
        """Rank 0: write ``info.json``, wait until every rank's shard is in place, then delete older checkpoints."""
        where = step_dir(self.directory, staged.step)
        tmp = where / ".info.json.tmp"
        tmp.write_text(json.dumps(asdict(staged.info)))
        _fsync(tmp)
        os.replace(tmp, where / "info.json")
        _fsync_dir(where)
        deadline = time.monotonic() + self.complete_timeout_s
        while _complete(where) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint {where}: not every rank's shard arrived within "
                                   f"{self.complete_timeout_s:.0f} s")
            time.sleep(0.05)
        for step in _steps(self.directory):
            if step != staged.step:
                shutil.rmtree(step_dir(self.directory, step), ignore_errors=True)
        _fsync_dir(self.directory)


def _fsync(path: Path) -> int:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
        return os.fstat(f.fileno()).st_size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- loading --------------------------------------------------------------------------------------


def load(directory: str | Path, policy: ShardedPolicy, optimizer: torch.optim.Optimizer,
         ranks: Ranks) -> CheckpointInfo:
    """Restore this rank's master rows and optimizer state from the newest complete checkpoint."""
    step = latest_step(directory)
    if step is None:
        if (Path(directory) / _LEGACY).is_dir():
            raise ConfigError(f"{directory} holds a checkpoint of an older trainer ({_LEGACY}/, with published rows); "
                              f"it cannot be resumed by this one")
        raise ConfigError(f"{directory} holds no complete checkpoint")
    path = step_dir(directory, step)
    info = _complete(path)
    assert info is not None
    if info.world_size != ranks.world:
        raise ConfigError(f"the checkpoint in {directory} was written by {info.world_size} rank(s); resume it with "
                          f"the same world size (torchrun --nproc-per-node {info.world_size}), not {ranks.world}")
    mine = path / rank_dir(ranks.rank, ranks.world)
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
    return info


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Per-parameter state as local tensors (a DTensor's own shard, not copied) and scalars."""
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"param_groups": state_dict["param_groups"], "state": {}}
    for index, state in state_dict["state"].items():
        entry = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tensors[f"{index}.{key}"] = _local(value)
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
