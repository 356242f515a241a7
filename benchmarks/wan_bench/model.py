"""The synthetic policy of parts 1–4 and the buckets seeded with it.

Three published versions of a Qwen3-shaped model stepped by Adam (:class:`~benchmarks.synthetic.
AdamSimulator`): ``v0`` after a few warm-up steps, ``v1`` one realistic step later (lr 1e-6: ~1.4 % of the bf16
elements change), ``v2`` one bigger step later (``big_lr``) whose delta is large enough to stripe over streams.
Each is saved as a safetensors file the agents load locally: an actor that already holds ``v0`` (or ``v1``) is
where every measurement starts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from aurora_store.codec import CodecParams, ModelLayout, pieces_from_states
from aurora_store.codec.digest import digest_state
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshots import write_snapshot
from benchmarks.synthetic import AdamSimulator
from benchmarks.wan_bench.config import BenchConfig


@dataclass
class ModelData:
    config: dict[str, Any]
    layout: ModelLayout
    files: dict[int, str]
    digests: dict[int, str]
    states: dict[int, dict[str, torch.Tensor]] = field(repr=False)
    build_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def describe(self) -> dict[str, Any]:
        return {"config": self.config, "parameters": self.layout.numel, "bf16_bytes": self.layout.nbytes,
                "build_s": round(self.build_s, 1)}


def build(cfg: BenchConfig, workdir: Path) -> ModelData:
    started = time.perf_counter()
    layout = ModelLayout.from_config(cfg.model_config)
    sim = AdamSimulator(layout, lr=cfg.lr, seed=cfg.seed)
    for _ in range(cfg.warmup_steps):
        sim.step()
    states = {0: sim.published()}
    sim.step()
    states[1] = sim.published()
    sim.lr = cfg.big_lr
    sim.step()
    states[2] = sim.published()
    del sim
    workdir.mkdir(parents=True, exist_ok=True)
    files, digests = {}, {}
    for version, state in states.items():
        path = workdir / f"v{version}.safetensors"
        save_file(state, str(path))
        files[version] = str(path)
        digests[version] = str(digest_state(layout, state))
    return ModelData(dict(cfg.model_config), layout, files, digests, states, time.perf_counter() - started)


def seed_deliver_bucket(data: ModelData, url: str, shards: int) -> dict[str, Any]:
    """Part 1's bucket: ``D_1`` (v0 → v1, the trainer's default 4 MiB segments) and a full snapshot of ``v1``."""
    store = DeltaStore(open_bucket(url))
    publisher = VersionPublisher(store, data.layout, CodecParams(), streams=4, record_history=False)
    report = publisher.publish(1, 0, _digest(data, 0), pieces_from_states(data.layout, data.states[0], data.states[1]))
    shard_bytes = max(1 << 20, math.ceil(data.nbytes / max(shards, 1)))
    snapshot = write_snapshot(store, 1, data.states[1], data.layout, _digest(data, 1), shard_bytes=shard_bytes)
    store.close()
    return {"delta_bytes": report.total_bytes, "delta_segments": report.segments,
            "density": report.manifest.density, "changed": report.manifest.changed_total,
            "snapshot_bytes": snapshot.total_bytes, "snapshot_files": len(snapshot.weight_files),
            "compression_vs_full": data.nbytes / report.total_bytes}


def seed_streams_bucket(data: ModelData, url: str, segment_bytes: int) -> dict[str, Any]:
    """Part 2's bucket: ``D_2`` (v1 → v2, the bigger step) in ``segment_bytes`` segments."""
    store = DeltaStore(open_bucket(url))
    publisher = VersionPublisher(store, data.layout, CodecParams(segment_bytes=segment_bytes), streams=4,
                                 record_history=False)
    report = publisher.publish(2, 1, _digest(data, 1), pieces_from_states(data.layout, data.states[1], data.states[2]))
    store.close()
    return {"delta_bytes": report.total_bytes, "segments": report.segments, "segment_bytes": segment_bytes,
            "density": report.manifest.density, "changed": report.manifest.changed_total}


def seed_run_bucket(url: str, run: str) -> None:
    """An empty home bucket with the run record a relay waits for (``home_region``)."""
    store = DeltaStore(open_bucket(url))
    store.put_run_info({"run": run, "home_region": "home", "source_bucket": store.url})
    store.close()


def _digest(data: ModelData, version: int):
    from aurora_store.codec import WeightsDigest

    return WeightsDigest.parse(data.digests[version])
