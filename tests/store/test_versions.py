"""The versioned delta store on every backend: publish, race, fetch, corruption, snapshots, history."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import uuid

import pytest
import torch

from aurora_store.codec import DeltaManifest, ModelLayout, TensorTarget, apply_delta, digest_state
from aurora_store.errors import (
    IntegrityError,
    VersionExistsError,
    VersionNotFoundError,
)
from aurora_store.store import DeltaStore, history, object_names, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot, write_snapshot
from aurora_store.store.transfer import fetch_segments
from aurora_store.testing.builders import TINY_QWEN3, perturb, publish, random_state

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


@pytest.fixture(params=["memory", "local", "s3"])
def store(request, tmp_path):
    if request.param == "memory":
        url = f"memory://{uuid.uuid4().hex}"
    elif request.param == "local":
        url = str(tmp_path / "bucket")
    else:
        url = request.getfixturevalue("s3_bucket_url")
    return DeltaStore(open_bucket(url, create=True))


def chain(n: int, seed: int = 0):
    states = [random_state(LAYOUT, seed)]
    for i in range(n):
        states.append(perturb(states[-1], 0.03, seed * 1000 + i))
    return states


def test_publish_fetch_apply_chain_bit_exact(store):
    states = chain(4)
    digest = digest_state(LAYOUT, states[0])
    for v in range(1, 5):
        report = publish(store, LAYOUT, states[v - 1], states[v], v, digest, streams=3)
        digest = digest_state(LAYOUT, states[v])
        assert report.manifest.weights_digest == str(digest)
    assert store.versions() == [1, 2, 3, 4]
    assert store.latest_version() == 4
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in states[0].items()}, version=0)
    for v in store.versions():
        manifest = store.manifest(v)
        apply_delta(manifest, fetch_segments(store, manifest.segments, streams=4), target)
    assert target.digest == digest_state(LAYOUT, states[4]) == target.full_digest()


def test_retried_publish_of_identical_manifest_succeeds_and_a_different_one_loses(store):
    states = chain(1)
    digest = digest_state(LAYOUT, states[0])
    report = publish(store, LAYOUT, states[0], states[1], 1, digest)
    store.publish_manifest(report.manifest)  # a retry whose first attempt succeeded
    other = perturb(states[0], 0.05, 99)
    with pytest.raises(VersionExistsError):
        publish(store, LAYOUT, states[0], other, 1, digest)
    with pytest.raises(FileExistsError):
        store.publish_manifest(dataclasses.replace(report.manifest, producer={"who": "someone else"}))
    assert store.manifest(1) == report.manifest


def test_racing_writers_exactly_one_version_winner(store):
    states = chain(1)
    digest = digest_state(LAYOUT, states[0])
    candidates = [perturb(states[0], 0.03, 500 + i) for i in range(4)]
    results: list = [None] * 4
    barrier = threading.Barrier(4)

    def writer(i):
        barrier.wait()
        try:
            results[i] = publish(store, LAYOUT, states[0], candidates[i], 1, digest).manifest
        except VersionExistsError as exc:
            results[i] = exc

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, DeltaManifest)]
    assert len(winners) == 1, results
    assert store.manifest(1) == winners[0]


def test_manifest_is_written_after_all_segments(store):
    states = chain(1)
    seen_manifest_early = []

    def on_segment(ref):
        seen_manifest_early.append(store.bucket.exists(object_names.delta(1)))

    report = publish(store, LAYOUT, states[0], states[1], 1, digest_state(LAYOUT, states[0]), on_segment=on_segment)
    assert report.segments > 1 and len(seen_manifest_early) == report.segments
    assert not any(seen_manifest_early)
    assert store.missing_segments(report.manifest.segments) == []


def test_bit_flipped_segment_in_bucket_raises_integrity_error(store):
    states = chain(1)
    report = publish(store, LAYOUT, states[0], states[1], 1, digest_state(LAYOUT, states[0]))
    ref = report.manifest.segments[0]
    data = bytearray(store.bucket.get(object_names.segment(ref.digest)))
    data[10] ^= 0xFF
    store.bucket.put(object_names.segment(ref.digest), bytes(data))
    with pytest.raises(IntegrityError):
        store.get_segment(ref)
    store.bucket.put(object_names.segment(ref.digest), bytes(data[:-5]))  # truncated upload
    with pytest.raises(IntegrityError):
        list(fetch_segments(store, report.manifest.segments))


def test_manifest_naming_a_missing_segment_is_detected(store):
    states = chain(1)
    report = publish(store, LAYOUT, states[0], states[1], 1, digest_state(LAYOUT, states[0]))
    victim = report.manifest.segments[-1]
    store.bucket.delete(object_names.segment(victim.digest))
    assert store.missing_segments(report.manifest.segments) == [victim]
    with pytest.raises(FileNotFoundError):
        list(fetch_segments(store, report.manifest.segments))


def test_unknown_version_and_replayed_manifest_under_a_new_name(store):
    states = chain(1)
    report = publish(store, LAYOUT, states[0], states[1], 1, digest_state(LAYOUT, states[0]))
    with pytest.raises(VersionNotFoundError):
        store.manifest(7)
    store.bucket.put(object_names.delta(7), report.manifest.to_bytes())  # version 1's manifest renamed
    from aurora_store.errors import ManifestError

    with pytest.raises(ManifestError, match="version 1"):
        DeltaStore(store.bucket).manifest(7)


def test_snapshot_roundtrip_and_tamper_detection(store):
    state = random_state(LAYOUT, 3)
    digest = digest_state(LAYOUT, state)
    manifest = write_snapshot(store, 5, state, LAYOUT, digest, extra_files={"config.json": b"{}"},
                              shard_bytes=64 * 1024)
    assert len(manifest.weight_files) > 1  # sharded
    assert read_snapshot_manifest(store, 5) == manifest
    loaded, _ = load_snapshot(store, 5, LAYOUT)
    for name in LAYOUT.train_names:
        assert torch.equal(loaded[name].view(torch.int16), state[name].view(torch.int16))
    assert store.snapshot_versions() == [5]
    assert store.latest_version() == 5
    name = manifest.weight_files[0]
    blob = bytearray(store.bucket.get(object_names.snapshot_dir(5) + name))
    blob[-1] ^= 1
    store.bucket.put(object_names.snapshot_dir(5) + name, bytes(blob))
    with pytest.raises(IntegrityError):
        load_snapshot(store, 5, LAYOUT)


def test_snapshot_over_parallel_streams_is_the_same_snapshot(store):
    # Files uploaded and downloaded on several streams: the same files, entries and tensors as one stream.
    state = random_state(LAYOUT, 4)
    digest = digest_state(LAYOUT, state)
    one = write_snapshot(store, 6, state, LAYOUT, digest, shard_bytes=32 * 1024)
    many = write_snapshot(store, 7, state, LAYOUT, digest, shard_bytes=32 * 1024, streams=3)
    assert len(many.weight_files) >= 3 and many.files == one.files and many.weight_files == one.weight_files
    loaded, _ = load_snapshot(store, 7, LAYOUT, streams=3, threads=2)
    assert set(loaded) == set(load_snapshot(store, 6, LAYOUT)[0]) == set(LAYOUT.train_names)
    for name in LAYOUT.train_names:
        assert torch.equal(loaded[name].view(torch.int16), state[name].view(torch.int16))
    with pytest.raises(ValueError):
        write_snapshot(store, 8, state, LAYOUT, digest, streams=0)
    assert store.snapshot_versions() == [6, 7]


def test_snapshot_file_with_a_misshaped_tensor_is_refused_by_name(store):
    # The file is intact (its SHA-256 is the manifest's) but one tensor has the wrong shape: a typed layout
    # error naming the problem, not a digest mismatch or a crash in the per-file hashing.
    from aurora_store.errors import LayoutError
    from aurora_store.store.snapshot_manifest import create_snapshot_manifest
    from aurora_store.store.snapshots import encode_weight_file, put_snapshot_file

    state = random_state(LAYOUT, 5)
    digest = digest_state(LAYOUT, state)
    name = LAYOUT.train_names[1]
    bad = dict(state, **{name: state[name].reshape(-1)[:-1].clone()})
    entry = put_snapshot_file(store, 9, "model.safetensors", encode_weight_file(bad))
    create_snapshot_manifest(store, 9, LAYOUT, digest, [entry], ["model.safetensors"])
    with pytest.raises(LayoutError, match=name.split(".")[-2]):
        load_snapshot(store, 9, LAYOUT, streams=2)


def test_history_rows_as_parquet(store):
    states = chain(3)
    digest = digest_state(LAYOUT, states[0])
    for v in range(1, 4):
        report = publish(store, LAYOUT, states[v - 1], states[v], v, digest)
        digest = digest_state(LAYOUT, states[v])
        history.record(store, history.row_from_manifest(report.manifest, encode_s=report.encode_s,
                                                        upload_s=report.upload_s, publish_s=report.total_s))
    table = history.load(store)
    assert table.column("version").to_pylist() == [1, 2, 3]
    assert all(0 < d < 0.2 for d in table.column("density").to_pylist())
    tensors = dict(table.column("tensor_changed").to_pylist()[0])
    assert sum(tensors.values()) == table.column("changed").to_pylist()[0]
    assert history.rows_from_manifests(store).column("delta_bytes").to_pylist() == \
        table.column("delta_bytes").to_pylist()


def test_layout_documents_are_verified(store):
    store.put_layout(LAYOUT)
    store.put_layout(LAYOUT)  # idempotent
    assert store.layout(LAYOUT.fingerprint) == LAYOUT
    from aurora_store.errors import LayoutError

    with pytest.raises(LayoutError):
        store.layout("sha256:" + hashlib.sha256(b"x").hexdigest())
