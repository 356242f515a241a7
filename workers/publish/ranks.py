"""Who this trainer process is among ``torchrun``'s workers, and the few collectives a trainer needs (ours,
and a transformers/TRL trainer publishing through :mod:`workers.integrations.hf_callback`).

Ranks exchange only small JSON documents (rollout samples, segment refs, digests, verdicts) plus, at
snapshot time, single parameters for their owner rank; the bytes each purpose moves are counted in
:attr:`Ranks.traffic` so what crosses ranks per step is observable. World size 1 (plain
``python -m workers.trainer``) creates no process group: every collective is the identity, so the
single-process trainer runs the same code path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from aurora_store.config import LaunchEnv
from aurora_store.errors import AuroraError, ConfigError

#: Collectives wait this long before failing (rank 0 may wait for actors for a whole step timeout).
DEFAULT_TIMEOUT_S = 3600.0


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    traffic: Counter = field(default_factory=Counter)  # payload bytes seen by this rank, per purpose

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "gloo") -> Ranks:
        """The process group ``torchrun`` describes in the environment (``WORLD_SIZE``, ``RANK``, …), or a
        single rank without a process group when it describes none. ``backend``: see
        ``workers.trainer.device.process_group_backend``."""
        world = LaunchEnv.from_env().world_size
        if world <= 1:
            return cls()
        if not dist.is_available():
            raise ConfigError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def leader(self) -> bool:
        """Rank 0: the only one that talks to Redis and writes manifests."""
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world > 1

    # --- JSON collectives ------------------------------------------------------------------------

    def broadcast(self, doc: Any, purpose: str) -> Any:
        """Rank 0's JSON-serialisable ``doc`` on every rank (other ranks pass anything, e.g. ``None``)."""
        if not self.sharded:
            return doc
        # Filled in place with rank 0's (unpickled) string, whatever each rank put there.
        box: list[Any] = [json.dumps(doc, separators=(",", ":")) if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        self.traffic[purpose] += len(box[0])
        return json.loads(box[0])

    def gather(self, doc: Any, purpose: str) -> list[Any] | None:
        """Every rank's ``doc``, in rank order, on rank 0; ``None`` elsewhere."""
        if not self.sharded:
            return [doc]
        text = json.dumps(doc, separators=(",", ":"))
        out: list[Any] | None = [None] * self.world if self.leader else None  # filled with every rank's text
        dist.gather_object(text, out, dst=0)
        if out is None:
            self.traffic[purpose] += len(text)
            return None
        self.traffic[purpose] += sum(len(t or "") for t in out)
        return [json.loads(t) for t in out]

    def agree(self, error: str | None, kind: type[AuroraError] = ConfigError) -> None:
        """Rank 0's verdict on every rank: raise ``kind`` everywhere if rank 0 found a problem, so no rank is
        left waiting in a collective the others will never enter."""
        verdict = self.broadcast(error, "verdict")
        if verdict:
            raise kind(verdict)

    def barrier(self) -> None:
        if self.sharded:
            dist.barrier()

    # --- tensors ---------------------------------------------------------------------------------

    def gather_rows(self, local: torch.Tensor, rows: int, owner: int) -> torch.Tensor | None:
        """The whole ``rows``-row tensor on ``owner`` from every rank's ``torch.chunk``-style dim-0 shard;
        ``None`` on other ranks. Moves one parameter, never more (snapshot writing, not publishing). Rows
        travel as raw bytes, so the result is bit-exact and any dtype works with any backend."""
        if not self.sharded:
            return local.cpu()  # snapshot files are written from the host (a no-op for CPU tensors)
        tail = tuple(local.shape[1:])
        wire = local.contiguous().reshape(local.shape[0], math.prod(tail)).view(torch.uint8)
        chunk = -(-rows // self.world)
        padded = torch.zeros((chunk, wire.shape[1]), dtype=torch.uint8)
        padded[: wire.shape[0]] = wire
        parts = [torch.empty_like(padded) for _ in range(self.world)] if self.rank == owner else None
        dist.gather(padded, parts, dst=owner)
        nbytes = padded.numel()
        self.traffic["snapshot_rows"] += nbytes * (self.world - 1) if parts is not None else nbytes
        if parts is None:
            return None
        return torch.cat(parts)[:rows].contiguous().view(local.dtype).reshape(rows, *tail)

    def close(self) -> None:
        if self.sharded and dist.is_initialized():
            dist.destroy_process_group()

    def finish(self, code: int) -> int:
        """Close the process group and end the process with ``code``.

        A single rank just returns ``code``. A sharded rank flushes its logs and output and leaves with
        ``os._exit``, skipping interpreter finalization, because finalizing can abort it (SIGABRT,
        "terminate called without an active exception") after a run that succeeded: FSDP's device mesh
        and DTensor's caches keep the gloo process group alive past ``destroy_process_group``, so its
        worker threads are still running when the interpreter shuts down, and one that drops the last
        reference to a finished collective's tensor then needs the GIL; during finalization that kills
        the thread mid-destructor (seen about once in 50 two-rank runs on a busy machine, in
        ``c10d::ProcessGroupGloo::runLoop`` → ``~AsyncGatherWork``). Every file the trainer writes is
        closed before this point, so skipping finalization loses nothing."""
        self.close()
        if not self.sharded:
            return code
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing left to save
                stream.flush()
        os._exit(code)
