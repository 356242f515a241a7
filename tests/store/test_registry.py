"""Bucket URL schemes come from a registry: builtins imported only when used, schemes of one's own registered
in-process or found through the ``aurora_store.buckets`` entry-point group — and a bucket class that exists only
in the tests (:mod:`tests.store.custom_bucket`) passes the conformance suite and carries a real run, opened by URL
in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aurora_store.errors import BucketNotFoundError, ConfigError
from aurora_store.store import BucketURL, open_bucket, register_bucket, registered_schemes
from aurora_store.store.local import LocalBucket
from aurora_store.store.registry import BUILTIN_SCHEMES, BucketRegistry
from aurora_store.testing.conformance import BucketConformance
from tests.store.custom_bucket import FACTORY, SCHEME, FlatDirBucket, install_entry_point, pythonpath
from tests.store.follow_run import run_and_check_every_version


@pytest.fixture(scope="module", autouse=True)
def testfs_scheme():
    register_bucket(SCHEME, FACTORY)  # the same factory again is a no-op, so other modules may register it too


def _other_factory(url, *, create, settings):
    return LocalBucket(url.path, create=create)


# --- the registry ---------------------------------------------------------------------------------


def test_builtin_backends_are_imported_only_when_a_url_needs_them(tmp_path):
    probe = f"""
import sys
from aurora_store.store import open_bucket
backends = ("aurora_store.store.local", "aurora_store.store.memory", "aurora_store.store.s3",
            "aurora_store.store.gcs", "boto3", "gcsfs")
loaded = lambda: [m for m in backends if m in sys.modules]
before = loaded()
open_bucket({str(tmp_path)!r})
open_bucket("memory://m", create=True)
after_local = loaded()
try:
    open_bucket("s3://b?endpoint_url=http://127.0.0.1:1&nope=1")  # refused by the S3 module's own URL check
except ValueError as exc:
    error = str(exc)
print(__import__("json").dumps([before, after_local, loaded(), error]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    before, after_local, after_s3, error = json.loads(out.stdout)
    assert before == []
    assert after_local == ["aurora_store.store.local", "aurora_store.store.memory"]
    assert "aurora_store.store.s3" in after_s3 and "aurora_store.store.gcs" not in after_s3
    assert "unknown S3 URL options ['nope']" in error


@pytest.mark.parametrize(("url", "scheme", "path"), [
    ("runs/a", "", "runs/a"), ("/data/runs?x#y", "", "/data/runs?x#y"), ("C:\\runs\\a", "", "C:\\runs\\a"),
    ("d:/runs", "", "d:/runs"), ("file:///data/a", "file", "/data/a"), ("S3://b/p?region=r&x", "s3", "/p"),
])
def test_urls_parse_into_what_factories_read(url, scheme, path):
    parsed = BucketURL.parse(url)
    assert (parsed.scheme, parsed.path) == (scheme, path)
    if scheme == "s3":
        assert (parsed.netloc, dict(parsed.query)) == ("b", {"region": "r"})


def test_a_bare_relative_path_opens_a_local_bucket(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bucket = open_bucket("runs/a", create=True)
    assert isinstance(bucket, LocalBucket) and bucket.url == (tmp_path / "runs" / "a").as_uri()


def test_a_taken_scheme_is_replaced_only_with_clobber():
    registry = BucketRegistry()
    registry.register("mine", _other_factory)
    registry.register("mine", _other_factory)  # the same factory: nothing to refuse
    with pytest.raises(ConfigError, match="'mine' is already registered"):
        registry.register("mine", FACTORY)
    with pytest.raises(ConfigError, match=r"'s3' is already registered.*aurora_store.store.s3:from_url"):
        registry.register("S3", FACTORY)
    registry.register("s3", _other_factory, clobber=True)
    assert registry.factory("s3") is _other_factory
    assert BucketRegistry().factory("s3") is not _other_factory  # registries are independent


@pytest.mark.parametrize("name", ["", "a", "1fs", "my_fs", "my fs", "fs:", "fs://", None])
def test_a_name_that_is_no_url_scheme_is_refused(name):
    with pytest.raises(ConfigError, match="is not a bucket URL scheme"):
        BucketRegistry().register(name, _other_factory)


@pytest.mark.parametrize("factory", [42, "no colon", "pkg.mod:", "pkg mod:attr"])
def test_a_factory_must_be_callable_or_a_module_attr_string(factory):
    with pytest.raises(ConfigError, match=r"a .package\.module:attr. string"):
        BucketRegistry().register("mine", factory)


def test_a_factory_that_does_not_import_is_a_config_error_naming_it():
    registry = BucketRegistry()
    registry.register("broken", "tests.store.no_such_module:from_url")
    with pytest.raises(ConfigError, match=r"'broken'.*tests.store.no_such_module:from_url"):
        registry.open("broken:///x")


def test_an_unknown_scheme_names_the_known_ones():
    with pytest.raises(ConfigError) as info:
        open_bucket("nosuch://bucket/run")
    message = str(info.value)
    assert "'nosuch' in nosuch://bucket/run" in message and "aurora_store.buckets" in message
    for scheme in [*BUILTIN_SCHEMES, SCHEME]:
        assert scheme in message
    assert set(BUILTIN_SCHEMES) | {SCHEME} <= set(registered_schemes())


def test_schemes_are_case_insensitive(tmp_path):
    registry = BucketRegistry()
    registry.register("MyFS", FACTORY)
    assert "myfs" in registry.schemes()
    assert isinstance(registry.open(f"MYFS://{tmp_path}", create=True), FlatDirBucket)


def test_entry_points_are_read_on_a_miss_and_import_only_that_scheme(tmp_path, monkeypatch):
    install_entry_point(tmp_path / "site", "epfs", distribution="ep_bucket")
    install_entry_point(tmp_path / "site", "brokenfs", "tests.store.no_such_module:from_url",
                        distribution="broken_bucket")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry = BucketRegistry(builtins={})
    assert {"epfs", "brokenfs"} <= set(registry.schemes())
    bucket = registry.open(f"epfs://{tmp_path / 'b'}", create=True)  # brokenfs is never imported
    assert isinstance(bucket, FlatDirBucket)
    with pytest.raises(ConfigError, match=r"'epfs' is already registered.*custom_bucket:from_url"):
        BucketRegistry().register("epfs", _other_factory)
    with pytest.raises(ConfigError, match="cannot load"):
        registry.open("brokenfs:///x")
    install_entry_point(tmp_path / "other-site", "epfs", "other.package:from_url", distribution="other_bucket")
    monkeypatch.syspath_prepend(str(tmp_path / "other-site"))
    with pytest.raises(ConfigError, match=r"several 'aurora_store\.buckets' entry points"):
        BucketRegistry().open("epfs:///x")


# --- a bucket class only the tests know -------------------------------------------------------------


class TestTestBucket(BucketConformance):
    @pytest.fixture()
    def bucket(self, tmp_path):
        return open_bucket(f"{SCHEME}://{tmp_path / 'bucket'}", create=True)

    def test_it_is_the_test_class_and_its_url_reopens_it(self, bucket, tmp_path):
        assert isinstance(bucket, FlatDirBucket)
        bucket.put("deltas/000000000001.json", b"1")
        assert open_bucket(bucket.url).get("deltas/000000000001.json") == b"1"
        assert [p.name for p in (tmp_path / "bucket" / "objects").iterdir()] == ["deltas%2F000000000001.json"]

    def test_its_own_url_checks(self, tmp_path):
        with pytest.raises(BucketNotFoundError):
            open_bucket(f"{SCHEME}://{tmp_path / 'missing'}")
        with pytest.raises(ConfigError, match="without host or options"):
            open_bucket(f"{SCHEME}://host/dir")


def test_another_process_finds_the_scheme_through_its_entry_point(tmp_path):
    site = install_entry_point(tmp_path / "site")
    bucket = open_bucket(f"{SCHEME}://{tmp_path / 'bucket'}", create=True)
    bucket.put("run.json", b"{}")
    probe = (f"from aurora_store.store import open_bucket; b = open_bucket({bucket.url!r}); "
             f"b.create('from-child', b.get('run.json')); print(type(b).__module__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": pythonpath(site)}, cwd=tmp_path)
    assert out.stdout.strip() == "tests.store.custom_bucket"
    assert bucket.get("from-child") == b"{}"


@pytest.mark.slow
@pytest.mark.redis
def test_a_real_actor_follows_a_run_through_the_test_bucket(tmp_path):
    bucket_url = open_bucket(f"{SCHEME}://{tmp_path / 'bucket'}", create=True).url  # before the actor looks
    run_and_check_every_version(tmp_path / "run", bucket_url, run="testfs", steps=3,
                                bucket_type=FlatDirBucket,
                                env={"PYTHONPATH": pythonpath(install_entry_point(tmp_path / "site"))})
    assert any((tmp_path / "bucket" / "objects").glob("deltas%2F*"))
