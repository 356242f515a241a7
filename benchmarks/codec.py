"""``python -m benchmarks codec``: encoding size and speed on realistic Adam-step deltas.

Every time is reported next to a baseline at the machine's limit measured in the same run on the same bytes
(:mod:`benchmarks.baselines`: the numpy compare scan, SHA-256, a bare ``index_put_``, a streaming read),
because these machines are shared and absolute seconds are noisy. The older ratios to a ``torch.ne`` +
``nonzero`` scan stay, named as such (``scan_s``, ``*_vs_scan``). Snapshot write / load against raw PUT /
GET need an S3 server: the scale benchmark measures them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import torch

from aurora_store.codec import (
    CodecParams,
    DeltaEncoder,
    DeltaManifest,
    ModelLayout,
    TensorTarget,
    WeightTarget,
    activate,
    pieces_from_states,
    stage,
)
from benchmarks.synthetic import QWEN3_BENCH_CONFIG, AdamSimulator


def _scan(layout: ModelLayout, old, new) -> float:
    pairs = [(a, b) for (_, _, a), (_, _, b) in zip(layout.pieces(old), layout.pieces(new))]
    t0 = time.perf_counter()
    for a, b in pairs:
        torch.ne(a, b).nonzero()
    return time.perf_counter() - t0


def _encode(layout, old, new, params, base_digest, threads: int = 1):
    encoder = DeltaEncoder(layout, params, encode_threads=threads)
    t0 = time.perf_counter()
    segments = list(encoder.segments(pieces_from_states(layout, old, new)))
    elapsed = time.perf_counter() - t0
    summary = encoder.summary
    manifest = DeltaManifest(
        version=1, base_version=0, layout_fingerprint=layout.fingerprint, codec=params,
        segments=tuple(s.ref for s in segments), changed=summary.changed, elements=layout.numel,
        base_weights_digest=str(base_digest), weights_digest=str(base_digest + summary.digest_delta))
    return manifest, segments, summary, elapsed


def run(config: dict[str, Any] | None = None, lr: float = 1e-6, warmup: int = 4, repeats: int = 3,
        segment_bytes: int = 4 << 20, seed: int = 0) -> dict[str, Any]:
    config = config or QWEN3_BENCH_CONFIG
    layout = ModelLayout.from_config(config)
    sim = AdamSimulator(layout, lr=lr, seed=seed)
    for _ in range(warmup):
        sim.step()
    old = sim.published()
    sim.step()
    new = sim.published()
    del sim
    base_target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0)
    base_digest = base_target.digest

    params = CodecParams(segment_bytes=segment_bytes)
    scans, encodes, applies = [], [], []
    for _ in range(repeats):
        scans.append(_scan(layout, old, new))
        manifest, segments, summary, elapsed = _encode(layout, old, new, params, base_digest)
        encodes.append(elapsed)
        blobs = {s.ref.digest: s.data for s in segments}
        target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0,
                                         digest=base_digest)
        t0 = time.perf_counter()
        staged = stage(manifest, blobs, target, threads=1)
        stage_s = time.perf_counter() - t0
        activate(staged, target)
        applies.append((time.perf_counter() - t0, stage_s))
    exact = all(torch.equal(a, b)
                for (_, _, a), (_, _, b) in zip(layout.pieces(_train_view(layout, target)), layout.pieces(new)))
    limits = _limits(layout, old, new, params, base_digest, manifest, blobs, repeats)

    plain = CodecParams(segment_bytes=segment_bytes, entropy="none")
    _, _, plain_summary, plain_elapsed = _encode(layout, old, new, plain, base_digest)

    changed = summary.changed_total
    manifest_bytes = len(manifest.to_bytes())
    naive = sum(n * ((4 if layout[name].numel < 2**31 else 8) + 2) for name, n in summary.changed.items())
    scan_s, encode_s = statistics.median(scans), statistics.median(encodes)
    apply_s = statistics.median(a for a, _ in applies)
    stage_s = statistics.median(s for _, s in applies)
    model_gb = layout.nbytes / 1e9
    return {
        "bench": "codec",
        "model": {"config": config, "parameters": layout.numel, "bf16_bytes": layout.nbytes},
        "lr": lr, "warmup_steps": warmup, "repeats": repeats, "segment_bytes": segment_bytes,
        "density": changed / layout.numel,
        "changed": changed,
        "segments": summary.segments,
        "delta_bytes": summary.segment_bytes + manifest_bytes,
        "manifest_bytes": manifest_bytes,
        "bytes_per_changed": (summary.segment_bytes + manifest_bytes) / changed,
        "index_bytes_per_changed": summary.index_bytes / changed,
        "value_bytes_per_changed": summary.value_bytes / changed,
        "container_bytes_per_changed": (summary.segment_bytes - summary.index_bytes - summary.value_bytes)
        / changed,
        "naive_bytes_per_changed": naive / changed,
        "no_entropy": {
            "bytes_per_changed": (plain_summary.segment_bytes + manifest_bytes) / changed,
            "index_bytes_per_changed": plain_summary.index_bytes / changed,
            "value_bytes_per_changed": plain_summary.value_bytes / changed,
            "encode_s": plain_elapsed,
            "encode_vs_scan": plain_elapsed / scan_s,
        },
        "scan_s": scan_s,
        "encode_s": encode_s,
        "stage_s": stage_s,
        "apply_s": apply_s,
        "encode_vs_scan": encode_s / scan_s,
        "apply_vs_scan": apply_s / scan_s,
        "scan_gb_per_s": model_gb / scan_s,
        "encode_gb_per_s": model_gb / encode_s,
        "apply_gb_per_s": model_gb / apply_s,
        "compression_vs_full": layout.nbytes / (summary.segment_bytes + manifest_bytes),
        "bit_exact": exact,
        "torch_threads": torch.get_num_threads(),
        **limits,
        "encode_vs_numpy_scan": limits["encode_1t_s"] / limits["scan_numpy_s"],
        "ns_per_element": {k: 1e9 * limits[f"{k}_s"] / layout.numel
                           for k in ("scan_numpy", "encode_1t", "digest_1t", "sha256", "read_both")},
        "ns_per_changed": {k: 1e9 * limits[f"{k}_s"] / changed for k in ("encode_1t", "stage_1t", "scatter_baseline")},
    }


def _limits(layout: ModelLayout, old, new, params: CodecParams, base_digest, manifest: DeltaManifest,
            blobs: dict[str, bytes], repeats: int) -> dict[str, Any]:
    """The paths at 1 and 2 threads against the baselines at the limit on the same bytes, best of ``repeats``."""
    from aurora_store.codec import kernels
    from aurora_store.codec.digest import digest_state
    from aurora_store.config import TransferSettings
    from aurora_store.store.publisher import VersionPublisher
    from aurora_store.store.versions import DeltaStore
    from benchmarks import baselines

    pairs = [(a, b) for (_, _, a), (_, _, b) in zip(layout.pieces(old), layout.pieces(new))]
    news = [b for _, b in pairs]

    def best(fn) -> float:
        return min(fn() for _ in range(repeats))

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0,
                                     digest=base_digest)
    staged = stage(manifest, blobs, target)
    # The scatter baseline writes into its own copy: the target stays on the base, to be staged against.
    jobs = baselines.scatter_jobs(layout, {k: v.clone() for k, v in old.items()}, staged.updates)
    publish_threads = kernels.DEFAULT_THREADS

    def publish() -> float:
        store = DeltaStore(f"memory://codec-bench-{uuid.uuid4().hex[:8]}", TransferSettings(streams=4), create=True)
        publisher = VersionPublisher(store, layout, params, streams=4, record_history=False)
        return timed(lambda: publisher.publish(1, 0, base_digest, pieces_from_states(layout, old, new)))

    out: dict[str, Any] = {
        "scan_numpy_s": best(lambda: baselines.numpy_scan_s(pairs)),
        "scan_numpy_publish_threads_s": best(lambda: baselines.numpy_scan_s(pairs, threads=publish_threads)),
        "sha256_s": best(lambda: baselines.sha256_s(news)),
        "read_both_s": best(lambda: baselines.read_s([a for a, _ in pairs] + news)),
        "scatter_baseline_s": baselines.scatter_s(jobs, repeats),
        "publish_memory_bucket_s": best(publish),
    }
    for t in (1, 2):
        def encode(t: int = t) -> float:
            return _encode(layout, old, new, params, base_digest, t)[3]

        def digest(t: int = t) -> float:
            return timed(lambda: digest_state(layout, new, threads=t))

        def staging(t: int = t) -> float:
            return timed(lambda: stage(manifest, blobs, target, threads=t))

        out[f"encode_{t}t_s"], out[f"digest_{t}t_s"], out[f"stage_{t}t_s"] = best(encode), best(digest), best(staging)
    out.update({
        "publish_vs_numpy_scan": out["publish_memory_bucket_s"] / out["scan_numpy_publish_threads_s"],
        "digest_vs_sha256": out["digest_1t_s"] / out["sha256_s"],
        "stage_vs_scatter": out["stage_1t_s"] / out["scatter_baseline_s"],
        "snapshot_write_vs_raw_put": None, "snapshot_load_vs_raw_get": None,
        "snapshot_note": "measured by `python -m benchmarks scale` against a real S3 server",
        "read_gb_per_s": 4 * layout.numel / out["read_both_s"] / 1e9,
        "threads": {"cores": os.cpu_count(), "baselines": 1, "paths": 1, "publish": publish_threads,
                    "scan_numpy_for_publish": publish_threads,
                    "speedup_2_threads": {k: out[f"{k}_1t_s"] / out[f"{k}_2t_s"]
                                          for k in ("encode", "digest", "stage")}},
    })
    return out


def _train_view(layout: ModelLayout, target: WeightTarget) -> dict[str, torch.Tensor]:
    fused = {t.name: target.fused_bits(t.name).view(torch.bfloat16).reshape(t.shape) for t in layout.tensors}
    return layout.split(fused)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--segment-bytes", type=int, default=4 << 20)
    parser.add_argument("--small", action="store_true", help="a ~20M-parameter model (quick check)")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(QWEN3_BENCH_CONFIG)
    if args.small:
        config.update(num_hidden_layers=1, vocab_size=4096)
    return run(config, lr=args.lr, warmup=args.warmup, repeats=args.repeats, segment_bytes=args.segment_bytes)
