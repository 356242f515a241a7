"""Real buckets for the ops tests: versions published with the real publisher (history rows included) and
real snapshots, plus surgical ways to damage them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aurora_store.codec import CodecParams, ModelLayout, digest_state, pieces_from_states
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshots import write_snapshot
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


@dataclass
class Run:
    """A published chain: ``states[v]`` are the bf16 weights of version ``v`` (training names)."""

    store: DeltaStore
    states: list[dict[str, torch.Tensor]]
    snapshots: tuple[int, ...]

    @property
    def latest(self) -> int:
        return len(self.states) - 1


def build_bucket(url: str, versions: int = 8, snapshots: tuple[int, ...] = (0, 3, 6), *, seed: int = 1,
                 fraction: float = 0.03) -> Run:
    """Publish versions 1..``versions`` (several small segments each) and snapshots at ``snapshots``."""
    store = DeltaStore(open_bucket(url, create=True))
    states = [random_state(LAYOUT, seed)]
    for i in range(versions):
        states.append(perturb(states[-1], fraction, seed * 1000 + i))
    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), streams=2,
                                 producer={"tool": "tests.ops"})
    store.put_run_info({"run": "ops-test", "layout": LAYOUT.fingerprint})
    for version in range(versions + 1):
        if version:
            publisher.publish(version, version - 1, digest_state(LAYOUT, states[version - 1]),
                              pieces_from_states(LAYOUT, states[version - 1], states[version]))
        if version in snapshots:
            write_snapshot(store, version, states[version], LAYOUT, digest_state(LAYOUT, states[version]),
                           extra_files={"config.json": b"{}"})
    return Run(store, states, tuple(snapshots))


def segment_of(store: DeltaStore, version: int, index: int = 0) -> str:
    return store.manifest(version).segments[index].digest


def rewrite(store: DeltaStore, key: str, data: bytes) -> None:
    """Overwrite an object in place, bypassing create-only writes (what a damaged bucket looks like)."""
    store.bucket.put(key, data)


def flip_bit(store: DeltaStore, key: str, offset: int | None = None) -> None:
    data = bytearray(store.get_object(key))
    at = len(data) // 2 if offset is None else offset
    data[at] ^= 0x10
    rewrite(store, key, bytes(data))


def truncate(store: DeltaStore, key: str, drop: int = 7) -> None:
    rewrite(store, key, store.get_object(key)[:-drop])


def all_keys(store: DeltaStore) -> list[str]:
    return store.list_objects("")


def segment_keys(store: DeltaStore, version: int) -> list[str]:
    return [object_names.segment(ref.digest) for ref in store.manifest(version).segments]
