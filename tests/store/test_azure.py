"""Azure Blob Storage as a first-class cloud: ``az://`` buckets through adlfs against a real emulator (Azurite,
started by the tests), the conformance suite with its create-only race, typed errors, a real actor following a
run published there, and the Parquet history read by pandas through the same fsspec URL."""

from __future__ import annotations

import threading

import pandas as pd
import pytest

from aurora_store.errors import BucketNotFoundError, ConfigError, StoreAuthError, VersionExistsError
from aurora_store.store import DeltaStore, history, open_bucket
from aurora_store.store.azure import AzureBucket
from aurora_store.testing.conformance import BucketConformance
from aurora_store.testing.servers import AZURITE_ACCOUNT, environment
from tests.ops.helpers import build_bucket
from tests.store.follow_run import run_and_check_every_version

pytestmark = pytest.mark.azure


class TestAzureBucket(BucketConformance):
    @pytest.fixture()
    def bucket(self, azure_bucket_url):
        bucket = open_bucket(f"{azure_bucket_url}/run-1")
        assert isinstance(bucket, AzureBucket) and bucket.capabilities.atomic_create
        return bucket

    def test_every_azure_scheme_opens_the_same_container(self, azure_bucket_url):
        container = azure_bucket_url.removeprefix("az://")
        open_bucket(f"az://{container}/run").put("run.json", b"{}")
        for url in (f"abfs://{container}/run", f"abfss://{container}/run",
                    f"abfs://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/run"):
            assert open_bucket(url).get("run.json") == b"{}"

    def test_prefix_isolates_keys(self, azure_bucket_url):
        a, ab = open_bucket(f"{azure_bucket_url}/run-a"), open_bucket(f"{azure_bucket_url}/run-ab")
        a.put("deltas/000000000001.json", b"a")
        ab.put("deltas/000000000002.json", b"b")
        assert a.list() == ["deltas/000000000001.json"]
        assert ab.list("deltas/") == ["deltas/000000000002.json"]

    def test_writers_with_their_own_clients_race_for_one_version_and_one_wins(self, azure_bucket_url):
        # As four trainers would: each its own filesystem (connection pool, event loop), each its own manifest.
        container = azure_bucket_url.removeprefix("az://")
        stores = [DeltaStore(AzureBucket(container, "run", fs=_fresh_filesystem())) for _ in range(4)]
        results: list[object] = [None] * 4
        barrier = threading.Barrier(4)

        def writer(i: int) -> None:
            barrier.wait()
            try:
                stores[i].create_object("deltas/000000000001.json", f"manifest {i}".encode(), error=VersionExistsError)
                results[i] = i
            except VersionExistsError as exc:
                results[i] = exc

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (winner,) = [r for r in results if isinstance(r, int)]
        assert sum(isinstance(r, VersionExistsError) for r in results) == 3
        assert stores[0].get_object("deltas/000000000001.json") == f"manifest {winner}".encode()

    def test_missing_container_and_bad_urls_are_typed(self, azure_server):
        with pytest.raises(BucketNotFoundError, match="no-such-container"):
            open_bucket("az://no-such-container/run")
        with pytest.raises(ConfigError, match="without a container"):
            open_bucket("az:///run")
        with pytest.raises(ConfigError, match=r"unknown Azure URL options \['account_key'\]"):
            open_bucket("az://c/run?account_key=secret")

    def test_wrong_key_is_an_auth_error_naming_the_container(self, azure_server, azure_bucket_url):
        container = azure_bucket_url.removeprefix("az://")
        wrong = azure_server.connection_string.replace("AccountKey=Eby8", "AccountKey=AAAA")
        with environment({"AZURE_STORAGE_CONNECTION_STRING": wrong}), \
                pytest.raises(StoreAuthError, match=container) as info:
            AzureBucket(container, "run", fs=_fresh_filesystem())
        assert isinstance(info.value, PermissionError)


def _fresh_filesystem():
    import adlfs

    return adlfs.AzureBlobFileSystem(skip_instance_cache=True, use_listings_cache=False)


def test_the_history_is_read_by_pandas_through_the_same_fsspec_url(azure_bucket_url):
    url = f"{azure_bucket_url}/run-1"
    build_bucket(url, versions=3, snapshots=(0,))
    dataset_url, options = history.location(url)
    assert dataset_url == f"{url}/history/"
    frame = pd.read_parquet(dataset_url, storage_options=options)  # credentials: adlfs's environment
    assert sorted(frame["version"].tolist()) == [1, 2, 3]
    store = DeltaStore(url)
    assert {int(v): d for v, d in zip(frame["version"], frame["weights_digest"])} == {
        v: store.manifest(v).weights_digest for v in (1, 2, 3)}


@pytest.mark.slow
@pytest.mark.redis
def test_a_real_actor_follows_a_run_published_to_azure(azure_bucket_url, tmp_path):
    url = f"{azure_bucket_url}/run"  # the processes inherit AZURE_STORAGE_CONNECTION_STRING
    run_and_check_every_version(tmp_path / "run", url, run="azure", steps=2,
                                bucket_type=AzureBucket)
    assert open_bucket(url).list("deltas/")
