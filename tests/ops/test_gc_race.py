"""gc racing publishes that reuse content-addressed segments (issue 17, case 4): whatever the interleaving,
no committed manifest ever names a missing segment. Before, gc deleted what it had planned from one
inventory, so a version published in between that re-used an identical segment lost it."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from aurora_store.codec import CodecParams, digest_state, pieces_from_states
from aurora_store.errors import IntegrityError
from aurora_store.ops.gc import collect_garbage, execute_plan, plan_gc
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshots import write_snapshot
from tests.ops.helpers import LAYOUT, random_state


def _step(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """+1 on the bit pattern of the same elements every time: DELTA16 stores only gaps and differences, so
    every version made by this step has byte-identical segments (the same SHA-256 names)."""
    out = {}
    for name, tensor in state.items():
        bits = tensor.view(torch.int16).clone()
        flat = bits.view(-1)
        flat[:: max(1, flat.numel() // 97)] += 1
        out[name] = bits.view(torch.bfloat16)
    return out


class Chain:
    def __init__(self, url: str) -> None:
        self.store = DeltaStore(open_bucket(url, create=True))
        self.publisher = VersionPublisher(self.store, LAYOUT, CodecParams(segment_bytes=4096), streams=2,
                                          record_history=False)
        self.states = [random_state(LAYOUT, 3)]
        write_snapshot(self.store, 0, self.states[0], LAYOUT, digest_state(LAYOUT, self.states[0]))

    def publish(self) -> int:
        version = len(self.states)
        old = self.states[-1]
        new = _step(old)
        for _ in range(3):  # a publish refused because gc took a segment away is simply redone
            try:
                self.publisher.publish(version, version - 1, digest_state(LAYOUT, old),
                                       pieces_from_states(LAYOUT, old, new))
                break
            except IntegrityError:
                continue
        else:
            raise AssertionError("publish refused three times")
        self.states.append(new)
        return version

    def snapshot(self, version: int) -> None:
        write_snapshot(self.store, version, self.states[version], LAYOUT, digest_state(LAYOUT, self.states[version]))

    def assert_complete(self) -> None:
        for version in self.store.versions():
            manifest = self.store.manifest(version)
            missing = self.store.missing_segments(manifest.segments)
            assert not missing, f"committed version {version} names {len(missing)} missing segment(s)"


def test_segments_are_shared_between_versions(tmp_path):
    chain = Chain(str(tmp_path / "b"))
    first, second = chain.publish(), chain.publish()
    assert chain.store.manifest(first).segments == chain.store.manifest(second).segments


def test_publish_between_plan_and_delete_keeps_its_segments(tmp_path):
    """The exact interleaving: gc plans (version 1's segments are unused), a publish re-uses them, gc
    deletes. Even with no grace period the re-listed manifest spares them."""
    chain = Chain(str(tmp_path / "b"))
    chain.publish()
    chain.snapshot(1)
    plan = plan_gc(chain.store, 1)
    assert plan.of_kind("segment")
    chain.publish()  # version 2 re-uses version 1's segments
    report = execute_plan(chain.store, plan, grace_s=0)
    assert set(report.spared) == {d.key for d in plan.of_kind("segment")}
    chain.assert_complete()


def test_recently_rewritten_segments_are_spared(tmp_path):
    chain = Chain(str(tmp_path / "b"))
    chain.publish()
    chain.snapshot(1)
    report = collect_garbage(chain.store, 1, grace_s=600)
    assert report.spared and report.deleted == len(report.plan.deletions) - len(report.spared)
    time.sleep(1.1)
    report = collect_garbage(chain.store, 1, grace_s=1.0)
    assert not report.spared and report.deleted >= 0


def _gc(store: DeltaStore, grace: float, start: threading.Barrier, errors: list[BaseException]) -> None:
    start.wait()
    try:
        collect_garbage(store, 1, grace_s=grace)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_gc_interleaved_with_reusing_publishes(tmp_path, backend, request):
    url = str(tmp_path / "b") if backend == "local" else request.getfixturevalue("s3_bucket_url")
    chain = Chain(url)
    rng = random.Random(17)
    grace = 0.5
    for _ in range(8):
        version = chain.publish()
        chain.snapshot(version)
        time.sleep(grace + 0.1)  # the segments are older than the grace period: gc wants them gone
        start = threading.Barrier(2)
        errors: list[BaseException] = []
        thread = threading.Thread(target=_gc, args=(chain.store, grace, start, errors))
        thread.start()
        start.wait()
        time.sleep(rng.uniform(0, 0.05))
        chain.publish()  # re-uses every segment gc is deleting
        thread.join(60)
        assert not thread.is_alive() and not errors, errors
        chain.assert_complete()
    assert len(chain.store.versions()) >= 1
