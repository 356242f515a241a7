"""Backend-neutral bucket conformance suite (à la zarr-python's StoreTests), run on every backend."""

from __future__ import annotations

import threading
import uuid

import pytest

from aurora_store.errors import (
    BucketNotFoundError,
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from aurora_store.store import Bucket, open_bucket


class BucketConformance:
    """Subclasses provide a ``bucket`` fixture returning an empty bucket."""

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

    def test_missing_object_is_typed(self, bucket: Bucket):
        with pytest.raises(ObjectNotFoundError):
            bucket.get("nope/x")
        with pytest.raises(FileNotFoundError):
            bucket.size("nope/x")
        assert not bucket.exists("nope/x")

    def test_create_only(self, bucket: Bucket):
        bucket.create("deltas/000000000001.json", b"first")
        with pytest.raises(ObjectExistsError):
            bucket.create("deltas/000000000001.json", b"second")
        with pytest.raises(FileExistsError):
            bucket.create("deltas/000000000001.json", b"first")
        assert bucket.get("deltas/000000000001.json") == b"first"

    def test_racing_creates_have_exactly_one_winner(self, bucket: Bucket):
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


class TestMemoryBucket(BucketConformance):
    @pytest.fixture()
    def bucket(self):
        return open_bucket(f"memory://{uuid.uuid4().hex}", create=True)

    def test_missing_bucket(self):
        with pytest.raises(BucketNotFoundError):
            open_bucket(f"memory://{uuid.uuid4().hex}")


class TestLocalBucket(BucketConformance):
    @pytest.fixture()
    def bucket(self, tmp_path):
        return open_bucket(str(tmp_path / "bucket"), create=True)

    def test_file_url_and_missing_directory(self, tmp_path):
        assert open_bucket(f"file://{tmp_path}").url == tmp_path.as_uri()
        with pytest.raises(BucketNotFoundError):
            open_bucket(str(tmp_path / "does-not-exist"))

    def test_no_temp_files_are_left_or_listed(self, bucket):
        bucket.put("a", b"1")
        bucket.create("b", b"2")
        with pytest.raises(ObjectExistsError):
            bucket.create("b", b"3")
        assert bucket.list() == ["a", "b"]
        assert sorted(p.name for p in bucket.root.iterdir()) == ["a", "b"]


class TestS3Bucket(BucketConformance):
    @pytest.fixture()
    def bucket(self, s3_bucket_url):
        return open_bucket(s3_bucket_url)

    def test_prefix_isolates_keys(self, s3_server, s3_bucket_url):
        base = s3_bucket_url.split("?")[0]
        query = s3_bucket_url.split("?")[1]
        a = open_bucket(f"{base}/run-a?{query}")
        b = open_bucket(f"{base}/run-b?{query}")
        a.put("deltas/000000000001.json", b"a")
        assert b.list() == []
        assert a.list() == ["deltas/000000000001.json"]

    def test_missing_bucket_is_named(self, s3_server):
        with pytest.raises(BucketNotFoundError, match="no-such-bucket"):
            open_bucket(s3_server.bucket_url("no-such-bucket"))

    def test_wrong_credentials_give_a_clear_error_naming_the_bucket(self, s3_server, s3_bucket_url, monkeypatch):
        from aurora_store.errors import StoreAuthError

        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "definitely-wrong")
        bucket_name = s3_bucket_url.split("//")[1].split("?")[0]
        with pytest.raises(StoreAuthError, match=bucket_name) as info:
            open_bucket(s3_bucket_url)
        assert "botocore" not in str(info.value)
        assert isinstance(info.value, PermissionError)

    def test_unreachable_endpoint_is_a_store_error(self, monkeypatch):
        from aurora_store.errors import StoreError
        from aurora_store.localservices import free_port

        monkeypatch.setenv("AURORA_CONNECT_TIMEOUT", "1")
        with pytest.raises(StoreError):
            open_bucket(f"s3://bucket?endpoint_url=http://127.0.0.1:{free_port()}")


# gcp-storage-emulator ignores preconditions: no handler in gcp_storage_emulator/handlers/objects.py reads
# ifGenerationMatch (checked in 2026.7.19), so a second create answers 200 and overwrites. The two create-only
# conformance tests cannot pass against it and are skipped, visibly, for GCS only. What still runs: the request
# Aurora sends carries ifGenerationMatch=0 (read back from the emulator's own request log), gcsfs's answer to a
# 412 becomes ObjectExistsError, and test_emulator_ignores_if_generation_match pins the limitation itself: it
# fails once the emulator honours the precondition, and then these skips should go.
_NO_PRECONDITIONS = pytest.mark.skip(reason="gcp-storage-emulator ignores ifGenerationMatch=0: a second create "
                                            "is answered 200 and overwrites (see test_emulator_ignores_...)")


class TestGCSBucket(BucketConformance):
    @pytest.fixture()
    def bucket(self, gcs_bucket_url):
        return open_bucket(gcs_bucket_url)

    @_NO_PRECONDITIONS
    def test_create_only(self, bucket: Bucket):
        pass

    @_NO_PRECONDITIONS
    def test_racing_creates_have_exactly_one_winner(self, bucket: Bucket):
        pass

    def test_emulator_ignores_if_generation_match(self, bucket: Bucket):
        bucket.create("deltas/000000000001.json", b"first")
        bucket.create("deltas/000000000001.json", b"second")  # real GCS: 412, i.e. ObjectExistsError
        assert bucket.get("deltas/000000000001.json") == b"second"

    def test_create_sends_if_generation_match_and_put_does_not(self, gcs_server, bucket: Bucket):
        bucket.create("deltas/000000000001.json", b"m")
        bucket.put("segments/ab/abcd", b"s")
        uploads = [line for line in gcs_server.log_file.read_text().splitlines()
                   if f"POST /upload/storage/v1/b/{bucket.bucket}/o" in line]
        assert len(uploads) == 2
        assert "ifGenerationMatch=0" in uploads[0] and "ifGenerationMatch" not in uploads[1]

    def test_a_412_is_object_exists(self, bucket: Bucket, monkeypatch):
        from gcsfs.retry import validate_response

        # The emulator never answers 412; feed gcsfs's own response check the status GCS would send.
        def conflict(path: str, data: bytes, **kwargs: object) -> None:
            validate_response(412, b"", path)

        monkeypatch.setattr(bucket.fs, "pipe_file", conflict)
        with pytest.raises(ObjectExistsError, match=r"deltas/000000000001\.json"):
            bucket.create("deltas/000000000001.json", b"m")

    def test_another_client_sees_new_writes(self, gcs_bucket_url):
        writer = open_bucket(gcs_bucket_url)
        # A second filesystem instance, as in another process (fsspec would otherwise share one).
        reader = open_bucket(f"{gcs_bucket_url}&skip_instance_cache=1")
        assert reader.fs is not writer.fs
        writer.put("deltas/000000000001.json", b"1")
        assert reader.list("deltas/") == ["deltas/000000000001.json"] and reader.size("deltas/000000000001.json") == 1
        writer.put("deltas/000000000001.json", b"111")
        writer.put("deltas/000000000002.json", b"2")
        assert reader.size("deltas/000000000001.json") == 3
        assert reader.exists("deltas/000000000002.json")
        assert reader.list("deltas/", start_after="deltas/000000000001.json") == ["deltas/000000000002.json"]

    def test_prefix_isolates_keys(self, gcs_bucket_url):
        base, query = gcs_bucket_url.split("?")
        a = open_bucket(f"{base}/run-a?{query}")
        ab = open_bucket(f"{base}/run-ab?{query}")
        a.put("deltas/000000000001.json", b"a")
        ab.put("deltas/000000000002.json", b"b")
        assert a.list() == ["deltas/000000000001.json"]
        assert ab.list("deltas/") == ["deltas/000000000002.json"]

    def test_url_reopens_the_same_bucket(self, bucket: Bucket):
        bucket.put("run.json", b"{}")
        assert open_bucket(bucket.url).get("run.json") == b"{}"

    def test_missing_bucket_is_named(self, gcs_server):
        with pytest.raises(BucketNotFoundError, match="no-such-bucket"):
            open_bucket(gcs_server.bucket_url("no-such-bucket"))
