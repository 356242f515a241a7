"""``python -m benchmarks scale``: the real publish, activation and snapshot paths at real Qwen3 sizes.

For each size a generator subprocess writes two consecutive bf16 versions (Adam steps at a small learning
rate) to raw files on local disk, chunk by chunk, so it never holds more than a chunk of fp32 optimiser
state. Then, each in its own subprocess so ``ru_maxrss`` is that path's alone:

* publisher — maps both versions (what a trainer holds: the previously published bf16 copy and the new
  one), runs a plain bit-compare scan of the same tensors, and publishes version 1 to the local S3 server
  (:class:`~aurora_store.testing.servers.S3Server`) through :class:`VersionPublisher` over S streams;
* actor — loads version 0 into memory, fetches + verifies + stages + activates version 1 into a
  :class:`TensorTarget`, then times a plain scatter of the same indices;
* snapshot writer and snapshot loader (bootstrap).

Times next to the scan/scatter of the same run are what count: the machines are shared and absolute seconds
are noisy. Sizes whose two bf16 versions do not fit the memory budget are reported as skipped, with the
measured figures that decided it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aurora_store.codec.digest import ZERO, WeightsDigest, hash_range
from aurora_store.codec.extract import MASK_BLOCK
from aurora_store.codec.layout import ModelLayout
from benchmarks.moe import MOE_SIZES, ExpertGradients, density_split, is_moe

_QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "head_dim": 128, "tie_word_embeddings": True}
SIZES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "intermediate_size": 3072},
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "intermediate_size": 6144},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "intermediate_size": 9728},
}
QWEN3_8B = {**_QWEN3, "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 12288, "tie_word_embeddings": False}
#: A few-MB model with the same structure, for the test (``--tiny``).
TINY: dict[str, dict[str, Any]] = {
    "tiny-a": {**_QWEN3, "vocab_size": 2048, "head_dim": 32, "hidden_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 384},
    "tiny-b": {**_QWEN3, "vocab_size": 4096, "head_dim": 32, "hidden_size": 256, "num_hidden_layers": 3,
               "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 768},
}
PAPER_QWEN3_8B = {"delta_bytes": 202e6, "extraction_s": 5.0}
_CHUNK = 1 << 23  # elements of fp32 optimiser state the generator holds at once (4 × 32 MiB)
_GIB = 1 << 30


# --- helpers shared by the roles ---------------------------------------------------------------------

def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class _RssPhases:
    """Peak resident memory per phase of a role, from ``/proc/self/status``: :meth:`end` reads the high-water
    mark (VmHWM) since the previous phase ended and resets it (``clear_refs`` 5), so a phase's peak is its own;
    :attr:`peak` stays the whole process's. Where the reset is refused, a phase's figure is cumulative."""

    def __init__(self) -> None:
        self.peak = 0
        self.phases: dict[str, int] = {}

    @staticmethod
    def current(field: str = "VmRSS") -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def end(self, phase: str) -> int:
        hwm = self.current("VmHWM")
        self.peak = max(self.peak, hwm)
        self.phases[phase] = max(self.phases.get(phase, 0), hwm)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return hwm


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _train_tensors(layout: ModelLayout) -> Iterator[tuple[str, str, int, tuple[int, ...]]]:
    """``(train name, inference name, flat offset in the inference tensor, shape)`` in layout order."""
    for tensor in layout.tensors:
        for comp in tensor.components:
            lo, _ = tensor.component_span(comp)
            yield comp.train_name, tensor.name, lo, tensor.component_shape(comp)


def _open_version(workdir: Path, layout: ModelLayout, name: str, *, in_memory: bool) -> dict[str, torch.Tensor]:
    """Training-layout bf16 tensors of one generated version: mapped from its file, or read into memory."""
    path = workdir / f"{name}.bin"
    flat = np.fromfile(path, dtype=np.int16) if in_memory else np.memmap(path, dtype=np.int16, mode="r")
    whole = torch.from_numpy(flat) if in_memory else torch.frombuffer(flat, dtype=torch.int16)
    state, pos = {}, 0
    for train, _, _, shape in _train_tensors(layout):
        n = math.prod(shape)
        state[train] = whole[pos: pos + n].view(torch.bfloat16).reshape(shape)
        pos += n
    return state


def _store(spec: dict[str, Any]):
    from aurora_store.config import TransferSettings
    from aurora_store.store.versions import DeltaStore

    return DeltaStore(spec["bucket_url"], TransferSettings(streams=spec["streams"]))


# --- roles (each runs in its own process) --------------------------------------------------------------

def _role_generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive bf16 versions from ``warmup`` + 1 Adam steps, chunk by chunk (Adam is elementwise)."""
    layout = ModelLayout.from_config(spec["config"])
    workdir = Path(spec["workdir"])
    lr, warmup, seed = spec["lr"], spec["warmup"], spec["seed"]
    digest = ZERO  # of the base version (the actor and the manifest need it; the new one follows from the delta)
    experts = ExpertGradients(spec["config"], seed)  # MoE: only some experts get a gradient at each step
    t0 = time.perf_counter()
    with open(workdir / "old.bin", "wb") as f_old, open(workdir / "new.bin", "wb") as f_new:
        for train, name, lo, shape in _train_tensors(layout):
            numel = math.prod(shape)
            row = math.prod(shape[1:]) if len(shape) > 1 else numel
            step = max(1, _CHUNK // row) * row
            for start in range(0, numel, step):
                n = min(step, numel - start)
                key = hashlib.sha256(f"{seed}:{train}:{start}".encode()).digest()
                rng = np.random.default_rng(int.from_bytes(key[:8], "little"))  # numpy's normals are ~10x torch's
                if len(shape) == 1:
                    master = torch.ones(n) if "norm" in train else torch.zeros(n)
                else:
                    # Master weights start from a bf16 checkpoint, as when fine-tuning a released model.
                    init = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).mul_(0.02)
                    master = init.to(torch.bfloat16).float()
                m, v = torch.zeros(n), torch.zeros(n)
                old = master.to(torch.bfloat16)
                for t in range(1, warmup + 2):
                    grad = torch.from_numpy(rng.standard_normal(n, dtype=np.float32))
                    keep = experts.mask(train, start, n, shape, t)
                    if keep is not None:
                        grad.mul_(keep)
                    m.mul_(0.9).add_(grad, alpha=0.1)
                    v.mul_(0.999).addcmul_(grad, grad, value=0.001)
                    c1, c2 = 1 - 0.9**t, 1 - 0.999**t
                    master.addcdiv_(m, v.div(c2).sqrt_().add_(1e-8), value=-lr / c1)
                    if t == warmup:
                        old = master.to(torch.bfloat16)
                new = master.to(torch.bfloat16)
                experts.count_changed(train, start, shape, warmup + 1, old, new)
                digest = digest + hash_range(name, lo + start, old.view(torch.int16))
                f_old.write(old.view(torch.int16).numpy().tobytes())
                f_new.write(new.view(torch.int16).numpy().tobytes())
    return {"generate_s": time.perf_counter() - t0, "old_digest": str(digest), "peak_rss": _peak_rss_bytes(),
            "expert_tally": experts.tally if experts.count else None}


def _scan(layout: ModelLayout, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    """A plain bit-compare + ``nonzero`` of every piece, in blocks of the size the publish path compares at
    once: a whole-tensor mask of the embedding would be ~0.13x the 0.6B model on top of the publisher's peak
    (the publish path never holds one)."""
    t0 = time.perf_counter()
    for (_, _, a), (_, _, b) in zip(layout.pieces(old), layout.pieces(new)):
        for lo in range(0, a.numel(), MASK_BLOCK):
            torch.ne(a[lo: lo + MASK_BLOCK], b[lo: lo + MASK_BLOCK]).nonzero()
    return time.perf_counter() - t0


def _role_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish version 1 once per bucket in ``publish_buckets`` (fresh buckets: every repeat uploads every
    segment), with a plain scan of the same tensors before each: min and median of both, and their ratio per
    repeat (a scan right next to each publish sees the same machine load and page-cache state)."""
    from aurora_store.codec.encoder import pieces_from_states
    from aurora_store.codec.params import CodecParams
    from aurora_store.config import TransferSettings
    from aurora_store.store.publisher import VersionPublisher
    from aurora_store.store.versions import DeltaStore

    layout = ModelLayout.from_config(spec["config"])
    workdir = Path(spec["workdir"])
    rss = _RssPhases()
    baseline = rss.current()  # interpreter, torch and the publish path's imports; no weights yet
    rss.end("imports")
    old = _open_version(workdir, layout, "old", in_memory=False)
    new = _open_version(workdir, layout, "new", in_memory=False)
    _scan(layout, old, new)  # faults both versions in, as a trainer's resident weights
    resident = rss.current()
    rss.end("warmup_scan")
    scans, publishes, encodes, ratios = [], [], [], []
    report = None
    for url in spec["publish_buckets"]:
        store = DeltaStore(url, TransferSettings(streams=spec["streams"]))
        publisher = VersionPublisher(store, layout, CodecParams(), streams=spec["streams"], record_history=False)
        scans.append(_scan(layout, old, new))
        rss.end("scan")
        t0 = time.perf_counter()
        report = publisher.publish(1, 0, WeightsDigest.parse(spec["old_digest"]),
                                   pieces_from_states(layout, old, new))
        publishes.append(time.perf_counter() - t0)
        rss.end("publish")
        encodes.append(report.encode_s)
        ratios.append(publishes[-1] / scans[-1])
    assert report is not None
    manifest = report.manifest
    return {"new_digest": manifest.weights_digest, "publish_s": min(publishes),
            "publish_median_s": float(np.median(publishes)), "publish_all_s": publishes,
            "encode_s": min(encodes), "upload_s": report.upload_s,
            "scan_s": min(scans), "scan_median_s": float(np.median(scans)),
            "publish_vs_scan_median": float(np.median(ratios)),
            "changed": manifest.changed_total, "segments": report.segments,
            "changed_by_tensor": dict(manifest.changed),
            "delta_bytes": report.total_bytes,
            # The raw peak: ru_maxrss, or the phases' high-water marks where a reset hid an earlier one.
            "peak_rss": max(_peak_rss_bytes(), rss.peak), "baseline_rss": baseline,
            "resident_after_warmup_rss": resident, "phase_peak_rss": rss.phases}


def _plain_scatter_jobs(layout: ModelLayout, weights: dict[str, torch.Tensor],
                        updates) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(storage, local indices, bits)`` per training tensor: the same writes as an activation, already cut at
    the q/k/v and gate/up boundaries, so timing them is the floor — one ``scatter_`` per tensor."""
    jobs = []
    for update in updates:
        tensor = layout[update.tensor]
        for comp in tensor.components:
            lo, hi = tensor.component_span(comp)
            a, b = torch.searchsorted(update.indices, torch.tensor([lo, hi])).tolist()
            if b > a:
                storage = weights[comp.train_name].view(torch.int16).view(-1)
                jobs.append((storage, update.indices[a:b] - lo, update.bits[a:b].clone()))
    return jobs


def _role_actor(spec: dict[str, Any]) -> dict[str, Any]:
    """Staging (fetch + verify + decode + digest; no writes) and activation (the batch-boundary scatter) timed
    apart, as an actor does them apart (staging runs in the background while it generates); activation is
    judged against a plain ``scatter_`` of the same indices into the same tensors."""
    from aurora_store.codec.decoder import activate
    from aurora_store.codec.target import TensorTarget
    from aurora_store.follow import BucketChain, Follower, Step

    layout = ModelLayout.from_config(spec["config"])
    workdir = Path(spec["workdir"])
    weights = _open_version(workdir, layout, "old", in_memory=True)  # an actor's resident weights
    base = WeightsDigest.parse(spec["old_digest"])
    target = TensorTarget.from_state(layout, weights, version=0, digest=base)
    store = _store(spec)
    follower = Follower(BucketChain(store), streams=spec["streams"])
    follower.attach(target)
    t0 = time.perf_counter()
    staged = follower.stage(Step(1))
    stage_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    activate(staged, target)
    activate_s = [time.perf_counter() - t0]
    rss = _peak_rss_bytes()
    # Repeat both (same values: idempotent writes; the target is put back on the base to be activated again).
    jobs = _plain_scatter_jobs(layout, weights, staged.updates)
    scatter_s = []
    for _ in range(spec.get("repeats", 3)):
        t0 = time.perf_counter()
        for storage, local, bits in jobs:
            storage.scatter_(0, local, bits)
        scatter_s.append(time.perf_counter() - t0)
        target.version, target.digest = 0, base
        t0 = time.perf_counter()
        activate(staged, target)
        activate_s.append(time.perf_counter() - t0)
    # Where the staging time goes, re-measured piece by piece (fetch alone; the digest work of staging:
    # hashing old and new bits at every changed index).
    from aurora_store.codec.digest import hash_elements
    from aurora_store.store.transfer import fetch_segments

    t0 = time.perf_counter()
    fetched = sum(len(data) for _, data in fetch_segments(store, store.manifest(1).segments,
                                                          streams=spec["streams"]))
    fetch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for update in staged.updates:
        hash_elements(update.tensor, update.indices, update.bits)
    digest_s = 2 * (time.perf_counter() - t0)
    new = _open_version(workdir, layout, "new", in_memory=False)
    exact = all(torch.equal(weights[k].view(torch.int16), new[k].view(torch.int16)) for k in weights)
    return {"stage_s": stage_s, "activate_s": min(activate_s), "first_activate_s": activate_s[0],
            "scatter_s": min(scatter_s), "bit_exact": exact,
            "fetch_s": fetch_s, "fetched_bytes": fetched, "digest_s": digest_s,
            "staged_bytes": sum(u.indices.numel() * 8 + u.bits.numel() * 2 for u in staged.updates),
            "peak_rss": rss}


def _role_snapshot_write(spec: dict[str, Any]) -> dict[str, Any]:
    from aurora_store.store.snapshots import write_snapshot

    layout = ModelLayout.from_config(spec["config"])
    new = _open_version(Path(spec["workdir"]), layout, "new", in_memory=False)
    store = _store(spec)
    t0 = time.perf_counter()
    manifest = write_snapshot(store, 1, new, layout, WeightsDigest.parse(spec["new_digest"]),
                              shard_bytes=spec["shard_bytes"])
    return {"snapshot_write_s": time.perf_counter() - t0, "snapshot_bytes": manifest.total_bytes,
            "peak_rss": _peak_rss_bytes()}


def _role_snapshot_load(spec: dict[str, Any]) -> dict[str, Any]:
    from aurora_store.store.snapshots import load_snapshot

    layout = ModelLayout.from_config(spec["config"])
    store = _store(spec)
    t0 = time.perf_counter()
    state, _ = load_snapshot(store, 1, layout)  # verifies every file's SHA-256 and the weights digest
    return {"snapshot_load_s": time.perf_counter() - t0, "tensors": len(state), "peak_rss": _peak_rss_bytes()}


ROLES = {"generate": _role_generate, "publish": _role_publish, "actor": _role_actor,
         "snapshot_write": _role_snapshot_write, "snapshot_load": _role_snapshot_load}


def _run_role(role: str, spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    spec_path = Path(spec["workdir"]) / f"{role}.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--role", role, "--spec", str(spec_path)],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{role} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- one size, the fit, the whole run ------------------------------------------------------------------

def _measure(name: str, config: dict[str, Any], *, server, streams: int, lr: float, warmup: int,
             budget: int, root: Path, env: dict[str, str], timeout: float, repeats: int = 3) -> dict[str, Any]:
    layout = ModelLayout.from_config(config)
    model_bytes = layout.nbytes
    available = _mem_available()
    need = 2 * model_bytes  # the publisher's previous + new bf16 versions, resident together
    if need > min(budget, available):
        return {"params": layout.numel, "full_bytes": model_bytes,
                "skipped": f"previous + new bf16 versions need {need / _GIB:.1f} GiB resident in the publisher; "
                           f"budget {budget / _GIB:.1f} GiB, MemAvailable measured {available / _GIB:.1f} GiB"}
    workdir = root / name
    workdir.mkdir(parents=True)
    bucket = f"scale-{name.replace('.', '-')}-{uuid.uuid4().hex[:6]}"
    server.create_bucket(bucket)
    spares = [f"{bucket}-r{i}" for i in range(1, repeats)]  # publish repeats: fresh buckets, full uploads
    for name_ in spares:
        server.create_bucket(name_)
    spec: dict[str, Any] = {"config": config, "workdir": str(workdir), "lr": lr, "warmup": warmup, "seed": 0,
                            "streams": streams, "bucket_url": server.bucket_url(bucket),
                            "publish_buckets": [server.bucket_url(b) for b in [*spares, bucket]],
                            "repeats": repeats, "shard_bytes": 1 << 30}
    try:
        gen = _run_role("generate", spec, env, timeout)
        spec.update(old_digest=gen["old_digest"])
        pub = _run_role("publish", spec, env, timeout)
        spec.update(new_digest=pub["new_digest"])  # the snapshot loader checks the files hash to it
        act = _run_role("actor", spec, env, timeout)
        (workdir / "old.bin").unlink()
        snap_w = _run_role("snapshot_write", spec, env, timeout)
        snap_l = _run_role("snapshot_load", spec, env, timeout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    changed = pub["changed"]
    return {
        "params": layout.numel, "density": changed / layout.numel, "changed": changed,
        "bytes_per_changed": pub["delta_bytes"] / changed if changed else None,
        "delta_bytes": pub["delta_bytes"], "full_bytes": model_bytes,
        "compression_vs_full": model_bytes / pub["delta_bytes"],
        "segments": pub["segments"],
        "publish_s": pub["publish_s"], "publish_median_s": pub["publish_median_s"],
        "publish_all_s": pub["publish_all_s"], "encode_s": pub["encode_s"], "scan_s": pub["scan_s"],
        "publish_vs_scan": pub["publish_s"] / pub["scan_s"], "publish_vs_scan_median": pub["publish_vs_scan_median"],
        # Staging (background, while generating) and activation (at a batch boundary) apart; the old combined
        # figure stays as fetch_stage_activate_s.
        "stage_s": act["stage_s"], "stage_vs_scatter": act["stage_s"] / act["scatter_s"],
        "activate_s": act["activate_s"], "scatter_s": act["scatter_s"],
        "activate_vs_scatter": act["activate_s"] / act["scatter_s"], "first_activate_s": act["first_activate_s"],
        "fetch_stage_activate_s": act["stage_s"] + act["first_activate_s"], "bit_exact": act["bit_exact"],
        "actor_fetch_s": act["fetch_s"], "actor_digest_s": act["digest_s"],
        "actor_staged_bytes": act["staged_bytes"],
        "snapshot_write_s": snap_w["snapshot_write_s"], "snapshot_load_s": snap_l["snapshot_load_s"],
        "snapshot_bytes": snap_w["snapshot_bytes"],
        "publisher_peak_rss_vs_model": pub["peak_rss"] / model_bytes,
        # What the raw figure is made of: the process before any weights (interpreter, torch, imports), both
        # versions resident after the warm-up scan (2.0 by construction), the peak of each phase.
        "publisher_baseline_rss_vs_model": pub["baseline_rss"] / model_bytes,
        "publisher_peak_rss_above_baseline_vs_model": (pub["peak_rss"] - pub["baseline_rss"]) / model_bytes,
        "publisher_resident_after_warmup_vs_model": pub["resident_after_warmup_rss"] / model_bytes,
        "publisher_phase_peak_rss_vs_model": {k: v / model_bytes for k, v in pub["phase_peak_rss"].items()},
        "actor_peak_rss_vs_model": act["peak_rss"] / model_bytes,
        "snapshot_writer_peak_rss_vs_model": snap_w["peak_rss"] / model_bytes,
        "snapshot_loader_peak_rss_vs_model": snap_l["peak_rss"] / model_bytes,
        "generator_peak_rss_vs_model": gen["peak_rss"] / model_bytes,
        "generate_s": gen["generate_s"],
        **(density_split(layout, pub["changed_by_tensor"], gen["expert_tally"]) if is_moe(config) else {}),
    }


def fit_exponent(params: list[float], times: list[float]) -> tuple[float, float] | None:
    """Least-squares ``log t = k log p + c`` → ``(k, c)``; None with fewer than two sizes."""
    if len(params) < 2:
        return None
    k, c = np.polyfit(np.log(params), np.log(times), 1)
    return float(k), float(c)


def run(sizes: dict[str, dict[str, Any]], *, streams: int = 4, lr: float = 1e-6, warmup: int = 2,
        budget_gib: float = 8.5, timeout: float = 3600.0, repeats: int = 3) -> dict[str, Any]:
    from aurora_store.testing.servers import S3Server

    root = Path(tempfile.mkdtemp(prefix="aurora-scale-"))
    results: dict[str, Any] = {}
    try:
        (root / "s3").mkdir()
        with S3Server(data_dir=str(root / "s3")).start() as server:
            env = {**os.environ, **server.env(), "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
            for name, config in sizes.items():
                try:
                    results[name] = _measure(name, config, server=server, streams=streams, lr=lr, warmup=warmup,
                                             budget=int(budget_gib * _GIB), root=root, env=env, timeout=timeout,
                                             repeats=repeats)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:  # keep the sizes already measured
                    results[name] = {"params": ModelLayout.from_config(config).numel, "failed": str(exc)[-500:]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = summarize(results, streams=streams, lr=lr, warmup=warmup, budget_gib=budget_gib)
    out["repeats"] = repeats
    return out


def summarize(results: dict[str, Any], *, streams: int, lr: float, warmup: int, budget_gib: float) -> dict[str, Any]:
    """The output object: per-size figures, growth exponents over the measured sizes, the 8B extrapolation."""
    measured = [r for r in results.values() if "skipped" not in r and "failed" not in r]
    ps = [float(r["params"]) for r in measured]
    pub_fit = fit_exponent(ps, [r["publish_s"] for r in measured])
    act_fit = fit_exponent(ps, [r["activate_s"] for r in measured])
    stage_fit = fit_exponent(ps, [r["stage_s"] for r in measured if "stage_s" in r]) \
        if all("stage_s" in r for r in measured) else None
    scan_fit = fit_exponent(ps, [r["scan_s"] for r in measured if "scan_s" in r]) \
        if all("scan_s" in r for r in measured) else None
    # The ratio to the in-run baseline cancels what the machine does to both (load, page cache): exponent 0
    # means the path grows exactly like the plain scan / scatter; 1 + that is the scan-normalised exponent.
    pub_rel = fit_exponent(ps, [r["publish_vs_scan"] for r in measured]) \
        if all("publish_vs_scan" in r for r in measured) else None
    act_rel = fit_exponent(ps, [r["activate_vs_scatter"] for r in measured]) \
        if all("activate_vs_scatter" in r for r in measured) else None
    big = ModelLayout.from_config(QWEN3_8B)
    extrapolated: dict[str, Any] = {"params": big.numel, "full_bytes": big.nbytes, "paper": PAPER_QWEN3_8B}
    if measured:
        largest = max(measured, key=lambda r: r["params"])
        extrapolated["delta_bytes"] = largest["bytes_per_changed"] * largest["density"] * big.numel
        extrapolated["basis"] = "bytes/changed and density of the largest measured size; time from the fit"
    if pub_fit is not None and act_fit is not None:
        extrapolated["publish_s"] = math.exp(pub_fit[1]) * big.numel ** pub_fit[0]
        extrapolated["activate_s"] = math.exp(act_fit[1]) * big.numel ** act_fit[0]
    if stage_fit is not None:
        extrapolated["stage_s"] = math.exp(stage_fit[1]) * big.numel ** stage_fit[0]
    return {
        "bench": "scale", "lr": lr, "warmup_steps": warmup, "streams": streams,
        "memory_budget_gib": budget_gib, "torch_threads": torch.get_num_threads(),
        "note": "publisher maps both versions from local files (RSS counts their resident pages); the actor "
                "holds version 0 in anonymous memory",
        "sizes": results,
        "publish_exponent": pub_fit[0] if pub_fit else None,
        "activate_exponent": act_fit[0] if act_fit else None,
        "stage_exponent": stage_fit[0] if stage_fit else None,
        "scan_exponent": scan_fit[0] if scan_fit else None,
        "publish_exponent_scan_normalised": 1 + pub_rel[0] if pub_rel else None,
        "activate_exponent_scatter_normalised": 1 + act_rel[0] if act_rel else None,
        "exponent_note": "raw exponents fit min-of-repeats seconds over the sizes; the normalised ones fit the "
                         "ratio to the same run's plain scan (publish) or plain scatter_ (activate), plus 1",
        "extrapolated_qwen3_8b": extrapolated,
    }


def merge(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """One object from several runs' outputs (e.g. sizes measured by separate invocations); later ones win."""
    first = outputs[0]
    results: dict[str, Any] = {}
    for out in outputs:
        results.update(out["sizes"])
    merged = summarize(results, streams=first["streams"], lr=first["lr"], warmup=first["warmup_steps"],
                       budget_gib=first["memory_budget_gib"])
    merged["merged_runs"] = len(outputs)
    return merged


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"comma-separated, from {', '.join([*SIZES, *MOE_SIZES])}")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warmup", type=int, default=2, help="Adam steps before the measured one")
    parser.add_argument("--memory-budget-gib", type=float, default=8.5,
                        help="skip sizes whose publisher would hold more than this resident")
    parser.add_argument("--repeats", type=int, default=3,
                        help="publishes (each into a fresh bucket) and activations per size; the minimum counts")
    parser.add_argument("--tiny", action="store_true", help="two few-MB models of the same shape (quick check)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="combine earlier outputs (sizes measured by separate runs) into one object and fit")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.merge:
        return merge([json.loads(Path(path).read_text()) for path in args.merge])
    if args.tiny:
        sizes = TINY
    else:
        names = [s.strip() for s in args.sizes.split(",") if s.strip()]
        known = {**SIZES, **MOE_SIZES}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown sizes {unknown}; choose from {list(known)}")
        sizes = {n: known[n] for n in names}
    return run(sizes, streams=args.streams, lr=args.lr, warmup=args.warmup, budget_gib=args.memory_budget_gib,
               repeats=args.repeats)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        result = ROLES[args.role](json.loads(Path(args.spec).read_text()))
    else:
        result = run_from_args(args)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
