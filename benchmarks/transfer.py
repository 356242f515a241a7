"""``python -m benchmarks transfer``: upload/download throughput over 1 vs S parallel streams.

Runs against the real S3 server (SeaweedFS) on loopback — and a local directory for reference — with
content-addressed segments of the configured size, through the same code the trainer, relays and actors
use (``DeltaStore.put_segment`` from a thread pool, ``fetch_segments``).

``versions`` (S3 only): one version after another (upload then download, ``streams`` streams) through one
long-lived store and the process's transfer pool — what a trainer and an actor do — against the old way as
the in-run baseline, a new pool and a new client (hence new connections) per version. ``first_version_s`` vs
``later_versions_s_mean`` is what staying warm saves after the first; ``warm_vs_cold`` compares the later
versions of both (lower is better).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aurora_store.codec.manifest import SegmentRef
from aurora_store.config import TransferSettings
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.pool import shared_pool
from aurora_store.store.transfer import fetch_segments
from aurora_store.testing.servers import S3Server, environment


def _segments(total_bytes: int, segment_bytes: int, seed: int) -> list[tuple[SegmentRef, bytes]]:
    out = []
    for i in range(max(1, total_bytes // segment_bytes)):
        data = hashlib.sha256(f"{seed}-{i}".encode()).digest() * (segment_bytes // 32)  # cheap, unique, 1 MiB+
        data = os.urandom(64) + data[64:]
        out.append((SegmentRef(hashlib.sha256(data).hexdigest(), len(data), ()), data))
    return out


def _upload(store: DeltaStore, segments, streams: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        for future in [pool.submit(store.put_segment, ref, data) for ref, data in segments]:
            future.result()
    return time.perf_counter() - started


def _download(store: DeltaStore, refs, streams: int) -> float:
    started = time.perf_counter()
    for _ in fetch_segments(store, refs, streams=streams):
        pass
    return time.perf_counter() - started


def _version_warm(store: DeltaStore, segments, streams: int) -> float:
    """Upload then download one version on the shared pool with a long-lived store (warm connections)."""
    started = time.perf_counter()
    lanes = shared_pool().lanes(streams)
    for future in [lanes.submit(store.put_segment, ref, data) for ref, data in segments]:
        future.result()
    for _ in fetch_segments(store, [ref for ref, _ in segments], streams=streams):
        pass
    return time.perf_counter() - started


def _version_cold(url: str, segments, streams: int) -> float:
    """The same with what each version used to get: a new pool and a new client, so new connections."""
    started = time.perf_counter()
    store = DeltaStore(open_bucket(url), TransferSettings(streams=streams))
    with ThreadPoolExecutor(max_workers=streams) as pool:
        for future in [pool.submit(store.put_segment, ref, data) for ref, data in segments]:
            future.result()
        refs = [ref for ref, _ in segments]
        for future in [pool.submit(store.get_segment, ref) for ref in refs]:
            future.result()
    store.close()
    return time.perf_counter() - started


def _versions(url: str, version_bytes: int, segment_bytes: int, streams: int, count: int) -> dict[str, Any]:
    warm_store = DeltaStore(open_bucket(url, create=True), TransferSettings(streams=streams))
    warm, cold = [], []
    for v in range(count):  # interleaved, so drifts of the machine hit both alike
        warm.append(_version_warm(warm_store, _segments(version_bytes, segment_bytes, seed=1000 + v), streams))
        cold.append(_version_cold(url, _segments(version_bytes, segment_bytes, seed=2000 + v), streams))
    warm_store.close()
    later_warm, later_cold = statistics.fmean(warm[1:]), statistics.fmean(cold[1:])
    return {"streams": streams, "version_bytes": version_bytes, "versions": count, "warm_s": warm, "cold_s": cold,
            "first_version_s": warm[0], "later_versions_s_mean": later_warm, "cold_versions_s_mean": later_cold,
            "first_vs_later": warm[0] / later_warm, "warm_vs_cold": later_warm / later_cold}


def _measure(url: str, total_bytes: int, segment_bytes: int, streams_list: list[int], repeats: int) -> dict:
    results: dict[str, Any] = {}
    for streams in streams_list:
        ups, downs = [], []
        for r in range(repeats):
            store = DeltaStore(open_bucket(url, create=True), TransferSettings(streams=streams))
            segments = _segments(total_bytes, segment_bytes, seed=hash((url, streams, r)) & 0xFFFF)
            ups.append(_upload(store, segments, streams))
            downs.append(_download(store, [ref for ref, _ in segments], streams))
        mb = total_bytes / 1e6
        results[str(streams)] = {"upload_s": statistics.median(ups), "download_s": statistics.median(downs),
                                 "upload_mb_per_s": mb / statistics.median(ups),
                                 "download_mb_per_s": mb / statistics.median(downs)}
    first, last = str(streams_list[0]), str(streams_list[-1])
    results["upload_speedup"] = results[first]["upload_s"] / results[last]["upload_s"]
    results["download_speedup"] = results[first]["download_s"] / results[last]["download_s"]
    return results


def run(total_mb: int = 64, segment_mb: int = 1, streams: tuple[int, ...] = (1, 4), repeats: int = 3,
        versions: int = 6) -> dict:
    total, segment = total_mb << 20, segment_mb << 20
    out: dict[str, Any] = {"bench": "transfer", "bytes": total, "segment_bytes": segment, "repeats": repeats,
                           "streams": list(streams), "cpus": os.cpu_count()}
    with S3Server() as s3:
        s3.start()
        s3.create_bucket("bench")
        with environment(s3.env()):
            out["s3_loopback"] = _measure(s3.bucket_url("bench", "transfer"), total, segment, list(streams), repeats)
            if versions >= 2:
                chain = _versions(s3.bucket_url("bench", "versions"), max(segment, total // 8), segment,
                                  max(streams), versions)
                out["s3_loopback"]["versions"] = chain
                for key in ("first_version_s", "later_versions_s_mean", "warm_vs_cold"):
                    out[key] = chain[key]
    with tempfile.TemporaryDirectory(prefix="aurora-bench-") as tmp:
        out["local_dir"] = _measure(tmp, total, segment, list(streams), repeats)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--mb", type=int, default=64, help="megabytes moved per direction and stream count")
    parser.add_argument("--segment-mb", type=int, default=1)
    parser.add_argument("--streams", type=_stream_counts, default=(1, 4), help="stream counts to compare, e.g. 1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--versions", type=int, default=6,
                        help="versions in the warm-vs-cold chain on S3 (each 1/8 of --mb; below 2: skipped)")


def _stream_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"needs positive counts such as 1,4, got {text!r}")
    return counts


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.mb, args.segment_mb, args.streams, args.repeats, args.versions)
