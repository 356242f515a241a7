"""Bounded reads (issue 17, case 6): a segment is read to at most its declared size + 1 bytes, and a local
bucket reads regular files inside itself only — a FIFO does not hang, a symlink to /dev/zero or out of the
bucket is refused."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from aurora_store.codec import ModelLayout, digest_state
from aurora_store.errors import BucketNotFoundError, IntegrityError, ManifestError, StoreError
from aurora_store.ops.verify import verify_bucket
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.testing.builders import TINY_QWEN3, perturb, publish, random_state

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


class CountingBucket:
    """Counts the bytes a real bucket hands out."""

    def __init__(self, inner):
        self.inner, self.bytes_read = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key, limit=None):
        data = self.inner.get(key, limit)
        self.bytes_read += len(data)
        return data


def _published(url: str) -> DeltaStore:
    store = DeltaStore(open_bucket(url, create=True))
    old = random_state(LAYOUT, 2)
    publish(store, LAYOUT, old, perturb(old, 0.05, 3), 1, digest_state(LAYOUT, old))
    return store


@pytest.fixture()
def alarm():
    """Fail instead of hanging if a read blocks (the FIFO case)."""
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("read blocked")))
    signal.alarm(20)
    yield
    signal.alarm(0)


@pytest.mark.parametrize("backend", ["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def test_oversized_object_in_a_segments_place_is_refused_after_size_plus_one_bytes(tmp_path, backend, request):
    url = {"local": str(tmp_path / "b"), "memory": f"memory://{uuid.uuid4().hex}"}.get(backend) \
        or request.getfixturevalue("s3_bucket_url")
    store = _published(url)
    ref = store.manifest(1).segments[0]
    store.bucket.put(object_names.segment(ref.digest), os.urandom(4 << 20))  # 4 MiB instead of ~4 KiB
    counting = CountingBucket(store.bucket)
    reader = DeltaStore(counting, store.settings)  # type: ignore[arg-type]
    with pytest.raises(IntegrityError, match="does not match"):
        reader.get_segment(ref)
    assert counting.bytes_read <= 2 * (ref.size + 1)  # one re-fetch, each bounded


def test_fifo_in_a_segments_place_does_not_hang(tmp_path, alarm):
    store = _published(str(tmp_path / "b"))
    ref = store.manifest(1).segments[0]
    path = tmp_path / "b" / object_names.segment(ref.digest)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(StoreError, match="not a regular file"):
        store.get_segment(ref)
    report = verify_bucket(store, deep=True)
    assert not report.ok


def test_symlinks_are_not_followed(tmp_path):
    store = _published(str(tmp_path / "b"))
    ref = store.manifest(1).segments[0]
    path = tmp_path / "b" / object_names.segment(ref.digest)
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(StoreError, match="symbolic link"):
        store.get_segment(ref)
    # a directory symlinked out of the bucket
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "000000000001.json").write_bytes(store.manifest_bytes(1))
    (tmp_path / "b" / "deltas" / "000000000001.json").unlink()
    (tmp_path / "b" / "deltas").rmdir()
    (tmp_path / "b" / "deltas").symlink_to(outside)
    with pytest.raises(StoreError, match="outside the bucket"):
        DeltaStore(str(tmp_path / "b")).manifest(1)


def test_oversized_manifest_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    from aurora_store.codec import jsondoc

    store = _published(str(tmp_path / "b"))
    monkeypatch.setattr(jsondoc, "MAX_DOCUMENT_BYTES", 1000)
    store.bucket.put(object_names.delta(2), b" " * 5000 + b"{}")
    counting = CountingBucket(store.bucket)
    with pytest.raises(ManifestError, match="larger than"):
        DeltaStore(counting, store.settings).manifest(2)  # type: ignore[arg-type]
    assert counting.bytes_read == 1001


def test_a_file_is_not_a_bucket(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(BucketNotFoundError, match="is a file"):
        open_bucket(str(tmp_path / "f"), create=True)
