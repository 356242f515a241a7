"""The bucket conformance suite, shipped for any backend (à la ``zarr.testing.store.StoreTests``).

A backend — ours or a user's — proves it is a :class:`~aurora_store.store.Bucket` by subclassing
:class:`BucketConformance` in a pytest module and providing a ``bucket`` fixture::

    class TestMyBucket(BucketConformance):
        @pytest.fixture()
        def bucket(self, tmp_path):
            return MyBucket(tmp_path)
"""

from __future__ import annotations

import threading

import pytest

from aurora_store.errors import InvalidKeyError, ObjectExistsError, ObjectNotFoundError
from aurora_store.store import Bucket


def require_atomic_create(bucket: Bucket) -> None:
    """Skip (visibly) a test of create-only semantics on a backend that does not declare them."""
    if not bucket.capabilities.atomic_create:
        pytest.skip(f"{type(bucket).__name__} declares no atomic create-only write (capabilities.atomic_create)")


class BucketConformance:
    """Every :class:`~aurora_store.store.Bucket` backend's contract, as tests.

    Subclass it in a test module and provide a ``bucket`` fixture that returns an empty bucket of your
    backend; every ``test_*`` method then runs against it. Tests of guarantees a backend may not give are
    skipped according to its :class:`~aurora_store.store.Capabilities` (e.g. ``atomic_create``).
    """

    def test_put_then_get(self, bucket: Bucket):
        bucket.put("a/b/c.bin", b"hello")
        assert bucket.get("a/b/c.bin") == b"hello"
        bucket.put("a/b/c.bin", b"world")
        assert bucket.get("a/b/c.bin") == b"world"

    def test_empty_and_binary_objects(self, bucket: Bucket):
        bucket.put("empty", b"")
        assert bucket.get("empty") == b""
        payload = bytes(range(256)) * 1000
        bucket.put("blob", payload)
        assert bucket.get("blob") == payload
        assert bucket.size("blob") == len(payload)

    def test_limited_get_reads_at_most_one_byte_more(self, bucket: Bucket):
        payload = bytes(range(256)) * 4096  # 1 MiB
        bucket.put("big", payload)
        assert bucket.get("big", 10) == payload[:11]
        assert bucket.get("big", len(payload)) == payload
        assert bucket.get("big", len(payload) - 1) == payload
        bucket.put("empty", b"")
        assert bucket.get("empty", 0) == b""
        with pytest.raises(ObjectNotFoundError):
            bucket.get("nope/x", 5)

    def test_read_into_streams_at_most_the_buffer_to_the_sink(self, bucket: Bucket):
        payload = bytes(range(256)) * 12288  # 3 MiB: several pieces for a streaming backend
        bucket.put("big", payload)
        for room in (11, len(payload), len(payload) + 1):
            buffer = bytearray(room)
            seen: list[bytes] = []

            def sink(piece: memoryview, into: list[bytes] = seen) -> None:
                into.append(bytes(piece))

            count = bucket.read_into("big", memoryview(buffer), sink)
            assert count == min(room, len(payload))
            assert bytes(buffer[:count]) == payload[:count] == b"".join(seen)
        bucket.put("empty", b"")
        assert bucket.read_into("empty", memoryview(bytearray(1))) == 0
        with pytest.raises(ObjectNotFoundError):
            bucket.read_into("nope/x", memoryview(bytearray(5)))

    def test_modified_moves_forward_on_rewrite(self, bucket: Bucket):
        bucket.put("m", b"1")
        first = bucket.modified("m")
        if first is None:
            pytest.skip(f"{type(bucket).__name__} does not report modification times")
        with pytest.raises(ObjectNotFoundError):
            bucket.modified("nope/x")
        bucket.put("m", b"1")
        second = bucket.modified("m")
        assert second is not None and second >= first

    def test_missing_object_is_typed(self, bucket: Bucket):
        with pytest.raises(ObjectNotFoundError):
            bucket.get("nope/x")
        with pytest.raises(FileNotFoundError):
            bucket.size("nope/x")
        assert not bucket.exists("nope/x")

    def test_create_only(self, bucket: Bucket):
        require_atomic_create(bucket)
        bucket.create("deltas/000000000001.json", b"first")
        with pytest.raises(ObjectExistsError):
            bucket.create("deltas/000000000001.json", b"second")
        with pytest.raises(FileExistsError):
            bucket.create("deltas/000000000001.json", b"first")
        assert bucket.get("deltas/000000000001.json") == b"first"

    def test_racing_creates_have_exactly_one_winner(self, bucket: Bucket):
        require_atomic_create(bucket)
        winners, losers = [], []
        barrier = threading.Barrier(6)

        def writer(i: int) -> None:
            barrier.wait()
            try:
                bucket.create("race/key", f"writer-{i}".encode())
                winners.append(i)
            except ObjectExistsError:
                losers.append(i)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1 and len(losers) == 5
        assert bucket.get("race/key") == f"writer-{winners[0]}".encode()

    def test_list_is_sorted_and_filtered_by_prefix(self, bucket: Bucket):
        for key in ["deltas/000000000002.json", "deltas/000000000001.json", "segments/ab/abcd", "run.json"]:
            bucket.put(key, b"x")
        assert bucket.list("deltas/") == ["deltas/000000000001.json", "deltas/000000000002.json"]
        assert bucket.list("segments/") == ["segments/ab/abcd"]
        assert bucket.list("nothing/") == []
        assert bucket.list() == sorted(["deltas/000000000001.json", "deltas/000000000002.json",
                                        "segments/ab/abcd", "run.json"])

    def test_list_start_after_reads_only_newer_keys(self, bucket: Bucket):
        for v in (1, 2, 3, 10):
            bucket.put(f"deltas/{v:012d}.json", b"x")
        assert bucket.list("deltas/", start_after="deltas/000000000002.json") == [
            "deltas/000000000003.json", "deltas/000000000010.json"]
        assert bucket.list("deltas/", start_after="deltas/000000000010.json") == []

    def test_delete_is_idempotent(self, bucket: Bucket):
        bucket.put("x/y", b"1")
        bucket.delete("x/y")
        bucket.delete("x/y")
        assert not bucket.exists("x/y")

    def test_a_bare_prefix_is_no_object(self, bucket: Bucket):
        bucket.put("deltas/000000000001.json", b"x")
        with pytest.raises(ObjectNotFoundError):
            bucket.size("deltas")
        assert not bucket.exists("deltas")

    @pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a"])
    def test_invalid_keys_are_rejected(self, bucket: Bucket, key: str):
        with pytest.raises(InvalidKeyError):
            bucket.put(key, b"x")
        with pytest.raises(ValueError):
            bucket.get(key)
