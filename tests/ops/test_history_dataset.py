"""The Parquet history read the way data people read Parquet: ``pandas.read_parquet("s3://…/history/",
storage_options=…)``, DuckDB over an fsspec filesystem and ``pyarrow.dataset`` — against the real S3 server
(SeaweedFS, through s3fs) and a directory — giving exactly the rows ``aurora log --json`` prints."""

from __future__ import annotations

import dataclasses
import json
import math

import duckdb
import fsspec
import pandas as pd
import pyarrow.dataset as ds
import pytest

from aurora_store.cli import main
from aurora_store.store import DeltaStore, history, object_names
from tests.ops.helpers import build_bucket

VERSIONS = 3


def log_rows(url: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["log", url, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["versions"]


def normalised(rows: list[dict]) -> list[dict]:
    """Rows with the per-tensor counts as a dict, whichever way a reader returns a Parquet map (pairs, a dict,
    DuckDB's key/value lists) and NaN as None (pandas' null float)."""
    out = []
    for row in rows:
        row = dict(row)
        changed = row["tensor_changed"]
        if isinstance(changed, dict) and set(changed) == {"key", "value"}:
            changed = dict(zip(changed["key"], changed["value"]))
        row["tensor_changed"] = dict(changed)
        out.append({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})
    return sorted(out, key=lambda r: r["version"])


def pandas_rows(frame: pd.DataFrame) -> list[dict]:
    columns = {c: frame[c].tolist() for c in frame.columns}  # tolist: Python scalars, not numpy's
    return normalised([dict(zip(columns, values)) for values in zip(*columns.values())])


def duckdb_rows(fs, url: str) -> list[dict]:
    con = duckdb.connect()
    try:
        con.register_filesystem(fs)
        cursor = con.execute(f"SELECT * FROM read_parquet('{url}*.parquet') ORDER BY version")
        names = [d[0] for d in cursor.description]
        return normalised([dict(zip(names, row)) for row in cursor.fetchall()])
    finally:
        con.close()


@pytest.mark.s3
def test_pandas_duckdb_and_pyarrow_read_the_s3_history_like_aurora_log(s3_server, s3_bucket_url, capsys):
    url = s3_bucket_url.replace("?", "/run-1?")  # under a run prefix, as Terraform lays buckets out
    build_bucket(url, versions=VERSIONS, snapshots=(0,))
    expected = log_rows(url, capsys)
    assert [r["version"] for r in expected] == list(range(1, VERSIONS + 1))
    assert all(r["encode_s"] is not None for r in expected)  # rows from the history, not rebuilt from manifests

    dataset_url, options = history.location(url)
    bucket = s3_bucket_url.split("//")[1].split("?")[0]
    assert dataset_url == f"s3://{bucket}/run-1/history/"
    assert options["endpoint_url"] == s3_server.endpoint_url
    # What a user writes: the server's endpoint and credentials as s3fs storage options.
    storage_options = {"key": s3_server.access_key, "secret": s3_server.secret_key,
                       "endpoint_url": s3_server.endpoint_url}
    frame = pd.read_parquet(dataset_url, storage_options=storage_options)
    assert pandas_rows(frame) == expected

    s3 = fsspec.filesystem("s3", **storage_options)
    assert duckdb_rows(s3, dataset_url) == expected

    fs, path = fsspec.core.url_to_fs(dataset_url, **options)  # credentials from the environment, like boto3
    table = ds.dataset(path, filesystem=fs, format="parquet").to_table()
    assert normalised(table.to_pylist()) == expected
    assert normalised(history.load(url).to_pylist()) == expected

    # A row written later shows up on the next read (fsspec reuses the filesystem: no stale listing).
    store = DeltaStore(url)
    row = history.row_from_manifest(store.manifest(VERSIONS))
    history.record(store, dataclasses.replace(row, version=VERSIONS + 1, base_version=VERSIONS))
    assert history.load(url).column("version").to_pylist() == list(range(1, VERSIONS + 2))


@pytest.mark.s3
def test_wrong_credentials_are_refused_not_read_as_empty(s3_server, s3_bucket_url):
    build_bucket(s3_bucket_url, versions=1, snapshots=(0,))
    dataset_url, _ = history.location(s3_bucket_url)
    with pytest.raises(PermissionError):
        pd.read_parquet(dataset_url, storage_options={"key": s3_server.access_key, "secret": "wrong",
                                                      "endpoint_url": s3_server.endpoint_url})


def test_a_directory_history_is_a_dataset_and_in_flight_writes_are_skipped(tmp_path, capsys):
    url = str(tmp_path / "bucket")
    (tmp_path / "bucket").mkdir()
    assert history.load(url).num_rows == 0  # no history yet: an empty table with the schema
    build_bucket(url, versions=VERSIONS, snapshots=(0,))
    # What a local writer leaves for a moment (a temporary file, renamed into place when complete).
    (tmp_path / "bucket" / object_names.HISTORY / ".aurora-tmp-0123abcd").write_bytes(b"partial")
    expected = log_rows(url, capsys)
    dataset_url, options = history.location(url)
    assert options == {} and dataset_url == f"{tmp_path / 'bucket'}/history/"
    assert pandas_rows(pd.read_parquet(dataset_url)) == expected
    assert duckdb_rows(fsspec.filesystem("file"), dataset_url) == expected
    assert normalised(history.load(url).to_pylist()) == expected


def test_a_memory_bucket_has_no_fsspec_location_but_loads(capsys):
    url = "memory://history-dataset-test"
    build_bucket(url, versions=2, snapshots=(0,))
    assert history.location(url) is None
    assert normalised(history.load(url).to_pylist()) == log_rows(url, capsys)


@pytest.mark.gcs
def test_the_gcs_history_is_a_dataset_through_gcsfs(gcs_bucket_url, capsys):
    gcsfs = pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install 'aurora-rl[gcs]')")
    build_bucket(gcs_bucket_url, versions=2, snapshots=(0,))
    expected = log_rows(gcs_bucket_url, capsys)
    dataset_url, options = history.location(gcs_bucket_url)
    assert dataset_url.startswith("gs://") and dataset_url.endswith("/history/")
    assert options["token"] == "anon" and options["endpoint_url"]  # the emulator, reached as the bucket is
    # pandas with gcsfs's JSON-API filesystem (plain gs:// storage_options pick gcsfs's gRPC-probing default,
    # which stalls against an emulator; on GCS itself storage_options=options is all it takes).
    frame = pd.read_parquet(dataset_url.removeprefix("gs://"), filesystem=gcsfs.core.GCSFileSystem(**options))
    assert pandas_rows(frame) == expected
    assert normalised(history.load(gcs_bucket_url).to_pylist()) == expected
