"""``python -m benchmarks extract``: per-step extraction + upload time of a sharded trainer, 1 vs N
ranks on the same model and the same Adam-step updates, measured in one run.

Each rank is a real process (gloo process group) that holds only its ``torch.chunk``-style dim-0 rows of the
fp32 master weights of every version, as an FSDP2 rank does. One timed step is what the trainer's publish
does per rank: cast its rows to bf16, diff them against the rows it published last, encode them as pieces
of the fused layout and upload its segments over its own streams; then the small per-rank metadata is
gathered and rank 0 writes the manifest. The step's wall time is rank 0's, from a barrier to the manifest.
Every rank runs one torch thread (torchrun's default), so per-rank throughput is per core.

Beside it, in the same run (:func:`encode_paths`): one step of the whole model as one rank's pieces (CPU
tensors) encoded by the host encoder (``extraction="host"``, compiled kernels) and by the device path run on the
CPU (``extraction="device"``, the torch ops a GPU runs), with the same thread count on both sides (encoding
threads, and torch's intra-op threads), in a process of its own (:func:`_paths_in_child`): ``device_vs_host`` =
device path ÷ host path; their segments must be byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import CodecParams, DeltaEncoder, ModelLayout, kernels
from aurora_store.codec.sharding import DeltaPart, LocalRows, even_rows, row_pieces, rows_digest
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from benchmarks import baselines
from benchmarks.synthetic import QWEN3_BENCH_CONFIG, AdamSimulator

#: Qwen3-8B (36 layers, hidden 4096, 32/8 heads of 128, MLP 12288, vocab 151936, untied).
QWEN3_8B_CONFIG: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 12288, "num_hidden_layers": 36, "vocab_size": 151936,
    "tie_word_embeddings": False,
}


def _versions(layout: ModelLayout, steps: int, lr: float, warmup: int, directory: Path) -> list[Path]:
    """fp32 master weights of versions 0..steps (Adam steps at a small lr), one safetensors file each."""
    from safetensors.torch import save_file

    sim = AdamSimulator(layout, lr=lr)
    for _ in range(warmup):
        sim.step()
    paths = []
    for version in range(steps + 1):
        if version:
            sim.step()
        path = directory / f"master-{version}.safetensors"
        save_file({k: v.contiguous() for k, v in sim.master.items()}, str(path))
        paths.append(path)
    return paths


def _rows(layout: ModelLayout, path: Path, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's rows of every training tensor, read without loading the others' (a rank never has them)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), "pt") as f:
        for name in layout.train_names:
            piece = f.get_slice(name)
            start, stop = even_rows(piece.get_shape()[0], rank, world)
            out[name] = piece[start:stop].contiguous()
    return out


def _rank_main(rank: int, world: int, spec: dict[str, Any]) -> None:
    """One rank of one world size (runs in a spawned process)."""
    import torch.distributed as dist

    from aurora_store.store import DeltaStore
    from aurora_store.store.publisher import VersionPublisher

    torch.set_num_threads(1)
    os.environ.update(spec.get("env", {}))
    dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=world)
    try:
        layout = ModelLayout.from_config(spec["config"])
        masters = [_rows(layout, Path(p), rank, world) for p in spec["versions"]]
        starts = {n: even_rows(layout.locate(n)[1].rows, rank, world)[0] for n in layout.train_names}

        def cast(master: dict[str, torch.Tensor]) -> dict[str, LocalRows]:
            return {n: LocalRows(n, starts[n], t.to(torch.bfloat16).contiguous()) for n, t in master.items()}

        store = DeltaStore(spec["bucket"], create=True)
        with ThreadPoolExecutor(spec["streams"]) as pool:  # warm connections, as a trainer's are after step 1
            list(pool.map(lambda i: store.put_object(f"bench/warmup-{rank}-{i}", b"x"), range(spec["streams"])))
        publisher = VersionPublisher(store, layout, CodecParams(segment_bytes=spec["segment_bytes"]),
                                     spec["streams"])
        published = cast(masters[0])
        contributions: list[str | None] = [None] * world if rank == 0 else None
        dist.gather_object(str(rows_digest(layout, published)), contributions, dst=0)
        digest = sum((WeightsDigest.parse(c) for c in contributions), ZERO) if rank == 0 else ZERO
        steps = []
        for version in range(1, len(masters)):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            new = cast(masters[version])
            cast_s = time.perf_counter() - t0
            part, upload = publisher.upload_part(row_pieces(layout, published, new))
            rank_s, rank_cpu_s = time.perf_counter() - t0, time.process_time() - c0
            # The baseline at the limit, on this rank's same rows, after the timed step: the numpy compare scan.
            scan_s = baselines.numpy_scan_s([(p.old, p.new) for p in row_pieces(layout, published, new)])
            mine = {"part": part.to_json(), "cast_s": cast_s, "encode_s": upload.encode_s,
                    "upload_s": upload.upload_s, "rank_s": rank_s, "rank_cpu_s": rank_cpu_s,
                    "scan_numpy_s": scan_s, "rows_elements": part.elements,
                    "segment_bytes": upload.segment_bytes}
            gathered: list[str | None] | None = [None] * world if rank == 0 else None
            text = json.dumps(mine)
            dist.gather_object(text, gathered, dst=0)
            if rank == 0:
                docs = [json.loads(t) for t in gathered]
                report = publisher.publish_parts(version, version - 1, digest,
                                                 [DeltaPart.from_json(d["part"]) for d in docs], started=t0)
                digest = WeightsDigest.parse(report.manifest.weights_digest)
            ack = [str(digest) if rank == 0 else None]
            dist.broadcast_object_list(ack, src=0)
            wall = time.perf_counter() - t0
            published = new
            if rank == 0:
                steps.append({"wall_s": wall, "metadata_bytes": sum(len(t) for t in gathered),
                              "changed": report.manifest.changed_total, "delta_bytes": report.total_bytes,
                              "ranks": [{k: d[k] for k in ("cast_s", "encode_s", "upload_s", "rank_s", "rank_cpu_s",
                                                           "scan_numpy_s",
                                                           "rows_elements", "segment_bytes")} for d in docs]})
        if rank == 0:
            Path(spec["result"]).write_text(json.dumps(steps))
    finally:
        dist.destroy_process_group()


def _measure(world: int, spec: dict[str, Any], work: Path, tag: str) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    spec = {**spec, "init": f"file://{work}/pg-{tag}", "result": str(work / f"result-{tag}.json")}
    mp.spawn(_rank_main, args=(world, spec), nprocs=world, join=True)
    return json.loads(Path(spec["result"]).read_text())


def _summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = len(steps[0]["ranks"])
    per_rank = [statistics.median(s["ranks"][r]["rank_s"] for s in steps) for r in range(ranks)]
    cpu = [statistics.median(s["ranks"][r]["rank_cpu_s"] for s in steps) for r in range(ranks)]
    elements = [steps[0]["ranks"][r]["rows_elements"] for r in range(ranks)]
    return {
        "ranks": ranks, "steps": len(steps),
        "wall_s": statistics.median(s["wall_s"] for s in steps),
        "wall_s_each": [round(s["wall_s"], 4) for s in steps],
        "rank_s": per_rank,
        "rank_cast_s": [statistics.median(s["ranks"][r]["cast_s"] for s in steps) for r in range(ranks)],
        "rank_encode_s": [statistics.median(s["ranks"][r]["encode_s"] for s in steps) for r in range(ranks)],
        "rank_upload_s": [statistics.median(s["ranks"][r]["upload_s"] for s in steps) for r in range(ranks)],
        "rank_scan_numpy_s": [statistics.median(s["ranks"][r]["scan_numpy_s"] for s in steps) for r in range(ranks)],
        # Each rank's encode (one torch thread, the host kernels' default threads) ÷ a one-thread numpy scan of
        # the same rows in the same step.
        "rank_encode_vs_numpy_scan": [statistics.median(s["ranks"][r]["encode_s"] / s["ranks"][r]["scan_numpy_s"]
                                                        for s in steps) for r in range(ranks)],
        "rank_elements": elements,
        "rank_elements_per_s": [e / t for e, t in zip(elements, per_rank)],
        "rank_cpu_s": cpu,
        "rank_elements_per_cpu_s": [e / t for e, t in zip(elements, cpu)],
        "metadata_bytes": statistics.median(s["metadata_bytes"] for s in steps),
        "changed": statistics.median(s["changed"] for s in steps),
        "delta_bytes": statistics.median(s["delta_bytes"] for s in steps),
    }


def encode_paths(layout: ModelLayout, versions: list[Path], *, threads: tuple[int, ...], repeats: int = 3,
                 segment_bytes: int = 4 << 20) -> dict[str, Any]:
    """Host encoder vs the device path on CPU tensors: versions 0 → 1 of the whole model (world size 1's rows)
    encoded by both, alternating, ``repeats`` times per thread count; the median seconds of each and their
    ratio per thread count, and whether every run's segments were byte-identical."""
    full = [{n: LocalRows(n, 0, t.to(torch.bfloat16).contiguous()) for n, t in _rows(layout, p, 0, 1).items()}
            for p in versions[:2]]
    pieces = list(row_pieces(layout, full[0], full[1]))
    params = CodecParams(segment_bytes=segment_bytes)
    before = torch.get_num_threads()
    by_threads: dict[str, dict[str, Any]] = {}
    fingerprints = set()
    changed = 0
    try:
        for count in threads:
            torch.set_num_threads(count)  # the device path's torch ops; the host path's kernels take `count`
            seconds: dict[str, list[float]] = {"host": [], "device": []}
            for _ in range(repeats):
                for extraction in ("host", "device"):
                    encoder = DeltaEncoder(layout, params, extraction=extraction, encode_threads=count)
                    digest = hashlib.sha256()
                    t0 = time.perf_counter()
                    for segment in encoder.segments(pieces):
                        digest.update(segment.data)
                    seconds[extraction].append(time.perf_counter() - t0)
                    fingerprints.add((digest.hexdigest(), str(encoder.summary.digest_delta)))
                    changed = encoder.summary.changed_total
            host, device = statistics.median(seconds["host"]), statistics.median(seconds["device"])
            by_threads[str(count)] = {"host_path_s": host, "device_path_s": device, "device_vs_host": device / host,
                                      "host_path_s_each": [round(x, 4) for x in seconds["host"]],
                                      "device_path_s_each": [round(x, 4) for x in seconds["device"]]}
    finally:
        torch.set_num_threads(before)
    top = by_threads[str(max(threads))]
    return {"threads": max(threads), "host_path_s": top["host_path_s"], "device_path_s": top["device_path_s"],
            "device_vs_host": top["device_vs_host"], "paths_by_threads": by_threads, "paths_repeats": repeats,
            "paths_elements": sum(p.old.numel() for p in pieces), "paths_changed": changed,
            "paths_byte_identical": len(fingerprints) == 1}


def _paths_main(_: int, spec: dict[str, Any]) -> None:
    """:func:`encode_paths` in a spawned process (its result written to ``spec["result"]``)."""
    layout = ModelLayout.from_config(spec["config"])
    result = encode_paths(layout, [Path(p) for p in spec["versions"]], threads=tuple(spec["threads"]),
                          repeats=spec["repeats"], segment_bytes=spec["segment_bytes"])
    result["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "")
    Path(spec["result"]).write_text(json.dumps(result))


def _paths_in_child(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """:func:`encode_paths` in a fresh process whose OpenMP threads sleep when idle (``OMP_WAIT_POLICY=PASSIVE``,
    unless the caller set a policy). OpenMP reads the policy once, when torch loads it. The device path on CPU
    is a sequence of short torch ops each split over the intra-op threads; with spinning threads beside the
    encoding threads on a shared machine, every op waits for a preempted spinner (measured here on two busy
    cores: 2.9 s spinning vs 0.38 s passive for the same encode, where the host path took 0.1 s either way)."""
    import torch.multiprocessing as mp

    spec = {**spec, "result": str(work / "result-paths.json")}
    previous = os.environ.get("OMP_WAIT_POLICY")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        mp.spawn(_paths_main, args=(spec,), nprocs=1, join=True)
    finally:
        if previous is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text())
    return result


def run(config: dict[str, Any] | None = None, *, worlds: tuple[int, ...] = (1, 2), steps: int = 3, rounds: int = 2,
        lr: float = 1e-6, warmup: int = 2, streams: int = 4, segment_bytes: int = 4 << 20,
        bucket: str | None = None, env: dict[str, str] | None = None, path_threads: tuple[int, ...] | None = None,
        path_repeats: int = 3) -> dict[str, Any]:
    """Measure every world size in ``worlds`` on the same versions, alternating world sizes for ``rounds``
    rounds so that load drifting on a shared machine hits all of them alike. ``bucket`` is a URL prefix
    (default: a fresh local directory); every (world size, round) publishes into its own sub-bucket. The host
    encoder and the device path are compared on ``path_threads`` (:func:`encode_paths`; empty: not at all), and
    an empty ``worlds`` measures only that."""
    config = config or QWEN3_BENCH_CONFIG
    layout = ModelLayout.from_config(config)
    with tempfile.TemporaryDirectory(prefix="aurora-bench-extract-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        versions = _versions(layout, steps, lr, warmup, work)
        prepare_s = time.perf_counter() - t0
        threads = (1, kernels.DEFAULT_THREADS) if path_threads is None else path_threads
        paths = _paths_in_child({"config": config, "versions": [str(p) for p in versions],
                                 "threads": sorted(set(threads)), "repeats": path_repeats,
                                 "segment_bytes": segment_bytes}, work) if threads else {}
        measured: dict[int, list[dict[str, Any]]] = {w: [] for w in worlds}
        for round_ in range(rounds):
            for world in worlds:
                tag = f"w{world}-r{round_}"
                url = str(work / f"bucket-{tag}")
                if bucket:
                    base, _, query = bucket.partition("?")
                    url = f"{base.rstrip('/')}/{tag}" + (f"?{query}" if query else "")
                spec = {"config": config, "versions": [str(p) for p in versions], "bucket": url,
                        "streams": streams, "segment_bytes": segment_bytes, "env": env or {}}
                measured[world] += _measure(world, spec, work, tag)
        results = {world: _summary(steps_) for world, steps_ in measured.items()}
    out: dict[str, Any] = {
        "bench": "extract",
        "model": {"config": config, "parameters": layout.numel, "bf16_bytes": layout.nbytes},
        "lr": lr, "steps": steps, "rounds": rounds, "streams_per_rank": streams, "segment_bytes": segment_bytes,
        "bucket": "s3" if bucket and bucket.startswith("s3://") else "local-directory",
        "cpu_cores": os.cpu_count(), "load_average": os.getloadavg()[0], "torch_threads_per_rank": 1,
        "prepare_s": prepare_s, **paths,
    }
    if not worlds:
        return out
    base = results[worlds[0]]
    out["density"] = base["changed"] / layout.numel
    out["worlds"] = {str(w): r for w, r in results.items()}
    for world in worlds[1:]:
        # wall: what this machine delivered; cpu: what it would with a free core per rank (the slowest rank's
        # CPU seconds per step — on a shared box the wall ratio also measures the other tenants)
        out[f"speedup_{worlds[0]}_to_{world}"] = base["wall_s"] / results[world]["wall_s"]
        out[f"cpu_speedup_{worlds[0]}_to_{world}"] = max(base["rank_cpu_s"]) / max(results[world]["rank_cpu_s"])
    out["estimate_8_ranks_qwen3_8b"] = estimate(results[max(worlds)], 8, ModelLayout.from_config(QWEN3_8B_CONFIG))
    return out


def estimate(measured: dict[str, Any], ranks: int, layout: ModelLayout) -> dict[str, Any]:
    """Per-step publish time for ``ranks`` ranks on ``layout`` from the measured per-rank throughput: ranks run
    in parallel on their own cores and streams, so a step takes one rank's share at that rate plus the
    metadata gather and manifest (as measured: wall minus the slowest rank). ``step_s`` uses the wall-clock
    rate measured here (pessimistic on a contended machine), ``step_cpu_s`` the rate per CPU second (a
    dedicated core per rank)."""
    rate = min(measured["rank_elements_per_s"])  # the slowest rank's elements per second
    cpu_rate = min(measured["rank_elements_per_cpu_s"])
    share = layout.numel / ranks
    overhead = max(measured["wall_s"] - max(measured["rank_s"]), 0.0)
    return {"parameters": layout.numel, "ranks": ranks, "elements_per_rank": share,
            "rank_elements_per_s": rate, "rank_s": share / rate, "overhead_s": overhead,
            "step_s": share / rate + overhead,
            "rank_elements_per_cpu_s": cpu_rate, "step_cpu_s": share / cpu_rate + overhead,
            "formula": "step_s = parameters / ranks / rank_elements_per_s + overhead_s"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--ranks", default="1,2", help="world sizes to compare, e.g. 1,2")
    parser.add_argument("--steps", type=int, default=3, help="timed publish steps per world size and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternate the world sizes this many times")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--streams", type=int, default=4, help="upload streams per rank")
    parser.add_argument("--segment-bytes", type=int, default=4 << 20)
    parser.add_argument("--small", action="store_true", help="a ~20M-parameter model (quick check)")
    parser.add_argument("--s3", action="store_true", help="upload to the local S3 server instead of a directory")
    parser.add_argument("--path-threads", default=f"1,{kernels.DEFAULT_THREADS}",
                        help="thread counts at which the host encoder and the device path (on CPU) are compared; "
                             "empty: not compared")
    parser.add_argument("--path-repeats", type=int, default=3, help="encodes per path and thread count")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(QWEN3_BENCH_CONFIG)
    if args.small:
        config.update(num_hidden_layers=1, vocab_size=4096)
    return main(config, args)


def main(config: dict[str, Any], args) -> dict[str, Any]:
    """The ``extract`` subcommand: parse world sizes, optionally start the local S3 server, run."""
    worlds = tuple(sorted({int(w) for w in str(args.ranks).split(",") if w.strip()}))
    if worlds and min(worlds) < 1:
        raise ValueError(f"--ranks needs positive world sizes, got {args.ranks!r}")
    path_threads = tuple(sorted({int(t) for t in str(args.path_threads).split(",") if t.strip()}))
    if (path_threads and min(path_threads) < 1) or args.path_repeats < 1:
        raise ValueError(f"--path-threads needs positive counts and --path-repeats ≥ 1, got {args.path_threads!r}, "
                         f"{args.path_repeats}")
    if not worlds and not path_threads:
        raise ValueError("nothing to measure: --ranks and --path-threads are both empty")
    common = {"worlds": worlds, "steps": args.steps, "rounds": args.rounds, "lr": args.lr, "streams": args.streams,
              "segment_bytes": args.segment_bytes, "path_threads": path_threads, "path_repeats": args.path_repeats}
    if not args.s3:
        return run(config, **common)
    from aurora_store.testing.servers import S3Server

    server = S3Server().start()
    try:
        server.create_bucket("bench-extract")
        return run(config, bucket=server.bucket_url("bench-extract"), env=server.env(), **common)
    finally:
        server.stop()
