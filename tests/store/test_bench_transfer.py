"""``python -m benchmarks transfer``: one JSON object comparing 1 vs S streams on the local S3 server and
a directory (tiny sizes here: the test checks the benchmark runs through the real code paths, not speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.s3
def test_transfer_bench_prints_one_json_object_for_both_stores():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "transfer", "--json", "--mb", "2",
                           "--segment-mb", "1", "--streams", "1,2", "--repeats", "1", "--versions", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    doc = json.loads(lines[0])
    assert doc["bench"] == "transfer" and doc["bytes"] == 2 << 20 and doc["streams"] == [1, 2]
    for store in ("s3_loopback", "local_dir"):
        for streams in ("1", "2"):
            figures = doc[store][streams]
            assert figures["upload_s"] > 0 and figures["download_s"] > 0
            assert figures["upload_mb_per_s"] == pytest.approx((2 << 20) / 1e6 / figures["upload_s"])
        one, two = doc[store]["1"], doc[store]["2"]
        assert doc[store]["download_speedup"] == pytest.approx(one["download_s"] / two["download_s"])
    chain = doc["s3_loopback"]["versions"]  # warm (one pool, one client) vs cold (both new) per version
    assert chain["versions"] == 3 and len(chain["warm_s"]) == len(chain["cold_s"]) == 3
    assert doc["first_version_s"] == chain["warm_s"][0] > 0
    assert doc["later_versions_s_mean"] == pytest.approx(sum(chain["warm_s"][1:]) / 2)
    assert doc["warm_vs_cold"] == pytest.approx(doc["later_versions_s_mean"] / chain["cold_versions_s_mean"])


def test_bad_stream_counts_are_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "transfer", "--streams", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2  # a usage error, before any server starts
    assert "argument --streams: needs positive counts" in proc.stderr


def test_unknown_benchmark_is_rejected_by_the_parser():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "nope"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
