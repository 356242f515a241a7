"""Buckets on any fsspec filesystem: a scheme Aurora has no backend for opens through the registry's fsspec
fallback (here ``local://``, fsspec's LocalFileSystem, whose ``pipe_file(mode="create")`` checks then writes).
Its capabilities say so, publishing there is refused with a typed error before anything is written, and an
operator who declares a single writer gets a working run."""

from __future__ import annotations

import pytest

from aurora_store.codec import CodecParams, ModelLayout, digest_state, pieces_from_states
from aurora_store.errors import ConfigError, CreateOnlyUnsupportedError, ObjectExistsError, StoreError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.anyfs import FsspecBucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.registry import BucketRegistry
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.testing.conformance import BucketConformance

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


class TestFsspecBucket(BucketConformance):
    """The conformance suite; its two create-only tests are skipped (visibly): the filesystem declares none."""

    @pytest.fixture()
    def bucket(self, tmp_path):
        bucket = open_bucket(f"local://{tmp_path / 'bucket'}", create=True)
        assert isinstance(bucket, FsspecBucket) and not bucket.capabilities.atomic_create
        return bucket

    def test_create_is_refused_without_a_declared_single_writer(self, bucket):
        with pytest.raises(CreateOnlyUnsupportedError, match="single_writer=true") as info:
            bucket.create("deltas/000000000001.json", b"m")
        assert isinstance(info.value, StoreError) and not bucket.exists("deltas/000000000001.json")

    def test_url_reopens_the_same_bucket_in_pandas_terms(self, bucket, tmp_path):
        bucket.put("run.json", b"{}")
        assert open_bucket(bucket.url).get("run.json") == b"{}"
        url, options = bucket.fsspec_url()
        assert url == f"local://{tmp_path / 'bucket'}" and options == {"use_listings_cache": False}


def _publish(url: str) -> DeltaStore:
    store = DeltaStore(open_bucket(url, create=True))
    old = random_state(LAYOUT, 3)
    new = perturb(old, 0.03, 4)
    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), streams=2)
    publisher.publish(1, 0, digest_state(LAYOUT, old), pieces_from_states(LAYOUT, old, new))
    return store


def test_publishing_refuses_before_writing_anything(tmp_path):
    with pytest.raises(CreateOnlyUnsupportedError, match=r"no atomic create-only write \(FsspecBucket\)"):
        _publish(f"local://{tmp_path / 'bucket'}")
    assert open_bucket(f"local://{tmp_path / 'bucket'}").list() == []  # not even the layout


def test_a_declared_single_writer_publishes_and_a_second_version_1_loses(tmp_path):
    url = f"local://{tmp_path / 'bucket'}?single_writer=true"
    store = _publish(url)
    assert store.bucket.capabilities.single_writer and store.versions() == [1]
    assert store.manifest(1).weights_digest
    with pytest.raises(ObjectExistsError):
        store.bucket.create("deltas/000000000001.json", b"another")
    # Another process opens the URL and sees the same declaration and run.
    again = DeltaStore(url)
    assert again.bucket.capabilities.single_writer and again.manifest(1) == store.manifest(1)


@pytest.mark.parametrize(("url", "message"), [
    ("local:///tmp/x?single_writer=maybe", "single_writer='maybe'"),
    ("dropbox://x/run", "cannot open dropbox://x/run"),  # fsspec names it, its package is not installed
])
def test_bad_urls_are_config_errors(url, message):
    with pytest.raises(ConfigError, match=message):
        open_bucket(url)


def test_the_fallback_is_only_for_protocols_fsspec_knows_and_yields_to_registrations(tmp_path):
    registry = BucketRegistry()
    assert isinstance(registry.open(f"local://{tmp_path}"), FsspecBucket)
    with pytest.raises(ConfigError, match="any fsspec protocol"):
        registry.open("nosuchfs://x")
    registry.register("local", "aurora_store.store.local:from_url")  # no clobber needed: only a fallback
    assert not isinstance(registry.open(f"local://{tmp_path}"), FsspecBucket)
    with pytest.raises(ConfigError, match="unsupported bucket URL scheme 'local'"):
        BucketRegistry(fallback=None).open(f"local://{tmp_path}")
