"""``python -m benchmarks activate``: activating a version inside vLLM — the batch boundary, and in place vs
a full reload.

**The batch boundary** (the default; ``--engine vllm``, the one engine measured here). For tensor
parallelism 1 and 2, a vLLM engine (engine core in its own process, as actors run it) is started from
version 0 of a run published into a local bucket, and followed by the actor's own
:class:`~aurora_store.follow.Follower`. For each version, after the follower has staged it (and every worker
has staged its own slice from the bucket), three things are timed on the same changed elements:

* **after** — the boundary as actors now cross it: ``Follower.activate`` + ``weights_changed``: one
  ``aurora_activate`` call carrying the version and its base, every worker writing what it holds, plus the
  prefix-cache reset;
* **before** — the push path (the fallback): the same changed elements sent as ``update_weights`` (indices and
  bits through vLLM's RPC, filtered by every TP worker) writing the same values again, plus the same reset;
* **worker scatter** — inside the worker, the ``index_put_`` calls of the held slice alone (the slowest rank).

``boundary_vs_worker_scatter_tp{1,2}`` (and ``…_before``) are the medians' ratios; ``boundary_rpc_bytes``
is what the boundary call carried. ``--size qwen3-0.6b`` (the default) has Qwen3-0.6B's exact shapes; its
versions flip ``--density`` of each tensor's elements by one bf16 ulp (the dominant Adam-step change; an
Adam simulator's fp32 state for 0.6 B parameters does not fit next to two engines on a small machine).
The weights are hashed inside the workers after every version and must equal its digest.

**In place vs a full reload** (``--reload``). One vLLM engine (engine core in its own process) is
bootstrapped from a snapshot; then, for each of a chain of realistic Adam-step versions, the same version is
made live twice:

* **in place** — what actors do: ``stage`` (verify + decode + digest check; one ``aurora_gather`` round trip
  in all) and ``activate`` + ``weights_changed`` (one ``update_weights`` call to the ``aurora`` backend writing
  the changed elements into vLLM's fused parameters, plus a prefix-cache reset);
* **full reload** — vLLM's supported path, ``collective_rpc("reload_weights", weights_path=…)``: the worker
  reads the whole checkpoint of that version (from the page cache: download time is not counted) and runs
  ``load_weights`` with layer-wise re-processing, plus the same prefix-cache reset.

Both are timed in the same run on the same engine and reported as a ratio next to absolute seconds, because
these machines are shared and absolute seconds are noisy. After each path the engine's weights are hashed
inside the worker and must equal the version's digest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from aurora_store.codec import (
    CodecParams,
    DeltaEncoder,
    DeltaManifest,
    ModelLayout,
    activate,
    pieces_from_states,
    stage,
)
from aurora_store.codec.digest import WeightsDigest, digest_state
from aurora_store.codec.layout import bits_view
from aurora_store.errors import DigestMismatchError
from aurora_store.follow import BucketChain, Follower, Step
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from benchmarks.synthetic import chained_states

#: A Qwen3-shaped decoder big enough for the numbers to mean something, small enough to start in seconds
#: on two CPU cores: hidden 512, 4 layers, head_dim 64 (a head size vLLM's CPU attention supports).
ACTIVATE_BENCH_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 512, "intermediate_size": 1536,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "vocab_size": 4096, "max_position_embeddings": 128, "tie_word_embeddings": True, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu",
    "attention_bias": False, "torch_dtype": "bfloat16",
}

#: ``--medium``: Qwen3-0.6B's widths with 8 layers and a 32k vocabulary (~0.16 B parameters, ~0.32 GB bf16).
MEDIUM_CONFIG: dict[str, Any] = {**ACTIVATE_BENCH_CONFIG, "hidden_size": 1024, "intermediate_size": 3072,
                                 "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
                                 "head_dim": 128, "vocab_size": 32000}


def _encode(layout: ModelLayout, old, new, version: int, base: WeightsDigest,
            params: CodecParams) -> tuple[DeltaManifest, dict[str, bytes]]:
    encoder = DeltaEncoder(layout, params)
    segments = list(encoder.segments(pieces_from_states(layout, old, new)))
    summary = encoder.summary
    manifest = DeltaManifest(
        version=version, base_version=version - 1, layout_fingerprint=layout.fingerprint, codec=params,
        segments=tuple(s.ref for s in segments), changed=summary.changed, elements=layout.numel,
        base_weights_digest=str(base), weights_digest=str(base + summary.digest_delta))
    return manifest, {s.ref.digest: s.data for s in segments}


def _write_checkpoint(directory: Path, state, layout: ModelLayout, side: dict[str, bytes] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({n: state[n].contiguous() for n in layout.train_names}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    for name, data in (side or {}).items():
        (directory / name).write_bytes(data)
    return directory


def _warm_up(engine, layout: ModelLayout, snapshot: Path, manifest: DeltaManifest) -> None:
    """First calls pay one-time costs (buffers sized for large messages, reload metadata): pay them untimed,
    with payloads the size of a real version, leaving the weights as they are."""
    engine.generate(["1+1="], 1, 4, 1.0, seed=0)
    target = engine.target
    for name, count in manifest.changed.items():
        indices = torch.arange(count, dtype=torch.int64) * (layout[name].numel // count)
        target.scatter(name, indices, target.gather(name, indices))  # writes back what is there
    engine.weights_changed()
    engine.collective_rpc("reload_weights", weights_path=str(snapshot))
    engine.reset_prefix_cache()


def _check(engine, digest: WeightsDigest, what: str) -> None:
    actual = engine.target.full_digest()
    if actual != digest:
        raise DigestMismatchError(f"{what}: engine weights hash to {actual}, expected {digest}")


def run(config: dict[str, Any] | None = None, versions: int = 4, lr: float = 1e-6, warmup: int = 4,
        seed: int = 0, segment_bytes: int = 4 << 20, multiprocess: bool = True) -> dict[str, Any]:
    """Time in-place activation against a full ``reload_weights`` for ``versions`` consecutive versions."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the one JSON object
    from workers.rl.model import side_files
    from workers.rl.task import build_tokenizer
    from workers.vllm.engine import VllmEngine

    config = dict(config or ACTIVATE_BENCH_CONFIG)
    layout = ModelLayout.from_config(config)
    states = chained_states(layout, versions, lr=lr, seed=seed, warmup=warmup)
    digests = [digest_state(layout, s) for s in states]
    params = CodecParams(segment_bytes=segment_bytes)
    deltas = [_encode(layout, states[v - 1], states[v], v, digests[v - 1], params) for v in range(1, versions + 1)]
    if not multiprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    records = []
    with tempfile.TemporaryDirectory(prefix="aurora-bench-activate-") as tmp:
        root = Path(tmp)
        snapshot = _write_checkpoint(root / "v0", states[0], layout, side_files(config, build_tokenizer()))
        full = [_write_checkpoint(root / f"full-{v}", states[v], layout) for v in range(1, versions + 1)]
        t0 = time.perf_counter()
        engine = VllmEngine(snapshot, layout, seed=seed, version=0)
        startup_s = time.perf_counter() - t0
        try:
            _check(engine, digests[0], "bootstrap")
            _warm_up(engine, layout, snapshot, deltas[0][0])
            for v, (manifest, blobs) in enumerate(deltas, start=1):
                target = engine.target
                before = target.rpc_calls.copy()
                t0 = time.perf_counter()
                staged = stage(manifest, blobs, target)
                t1 = time.perf_counter()
                activate(staged, target)
                engine.weights_changed()
                t2 = time.perf_counter()
                _check(engine, digests[v], f"in-place activation of version {v}")
                rpc = {k: n - before.get(k, 0) for k, n in target.rpc_calls.items() if n - before.get(k, 0)}
                rpc.pop("aurora_digest", None)
                t3 = time.perf_counter()
                engine.collective_rpc("reload_weights", weights_path=str(full[v - 1]))
                engine.reset_prefix_cache()
                t4 = time.perf_counter()
                _check(engine, digests[v], f"full reload of version {v}")
                changed = sum(manifest.changed.values())
                records.append({
                    "version": v, "changed": changed, "density": changed / layout.numel,
                    "stage_s": t1 - t0, "activate_s": t2 - t1, "reload_s": t4 - t3, "rpc": rpc,
                    "wire_bytes": sum(n * (2 + (4 if layout[name].numel < 2**31 else 8))
                                      for name, n in manifest.changed.items()),
                })
        finally:
            engine.close()
    activate_s = statistics.median(r["activate_s"] for r in records)
    reload_s = statistics.median(r["reload_s"] for r in records)
    stage_s = statistics.median(r["stage_s"] for r in records)
    return {
        "bench": "activate",
        "engine": "vllm", "multiprocess": multiprocess,
        "model": {"config": config, "parameters": layout.numel, "bf16_bytes": layout.nbytes},
        "versions": versions, "lr": lr, "warmup_steps": warmup,
        "density": statistics.median(r["density"] for r in records),
        "engine_startup_s": startup_s,
        "activate_s": activate_s,
        "stage_s": stage_s,
        "reload_s": reload_s,
        "reload_vs_activate": reload_s / activate_s,
        "reload_vs_stage_plus_activate": reload_s / (stage_s + activate_s),
        "activate_wire_bytes": statistics.median(r["wire_bytes"] for r in records),
        "per_version": records,
        "bit_exact": True,  # every activation and reload was checked against the version's digest
        "torch_threads": torch.get_num_threads(),
    }


#: Qwen3-0.6B's shapes (28 layers, a 151,936-token vocabulary, tied embeddings; ~0.6 B parameters).
QWEN3_06B_CONFIG: dict[str, Any] = {**MEDIUM_CONFIG, "num_hidden_layers": 28, "vocab_size": 151936}
BOUNDARY_SIZES: dict[str, dict[str, Any]] = {"qwen3-0.6b": QWEN3_06B_CONFIG, "medium": MEDIUM_CONFIG,
                                             "small": ACTIVATE_BENCH_CONFIG}


def _bf16_state(layout: ModelLayout, seed: int) -> dict[str, torch.Tensor]:
    """bf16 weights like a released model's (N(0, 0.02) matrices, ones for norms), made one tensor at a time."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for tensor in layout.tensors:
        for comp in tensor.components:
            shape = tensor.component_shape(comp)
            if len(shape) == 1:
                state[comp.train_name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                state[comp.train_name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    return state


def _ulp_step(state, density: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``density`` of every tensor's elements moved by one bf16 ulp, up or down (what most Adam-step changes
    are); the other elements unchanged."""
    out = {}
    for name, tensor in state.items():
        bits = bits_view(tensor.contiguous()).reshape(-1)
        hit = torch.rand(bits.numel(), generator=gen) < density
        step = torch.where(torch.rand(bits.numel(), generator=gen) < 0.5, 1, -1).to(torch.int16)
        out[name] = (bits + hit.to(torch.int16) * step).view(torch.bfloat16).reshape(tensor.shape)
    return out


def _publish_run(root: Path, config: dict[str, Any], versions: int, density: float, seed: int,
                 segment_bytes: int) -> tuple[DeltaStore, ModelLayout, Path]:
    """Version 0 as a checkpoint directory vLLM loads, and ``versions`` deltas on it in a local bucket."""
    from workers.rl.model import side_files
    from workers.rl.task import build_tokenizer

    layout = ModelLayout.from_config(config)
    store = DeltaStore(open_bucket(str(root / "bucket"), create=True))
    publisher = VersionPublisher(store, layout, CodecParams(segment_bytes=segment_bytes))
    state = _bf16_state(layout, seed)
    snapshot = _write_checkpoint(root / "v0", state, layout, side_files(config, build_tokenizer()))
    digest = digest_state(layout, state)
    gen = torch.Generator().manual_seed(seed + 1)
    for version in range(1, versions + 1):
        new = _ulp_step(state, density, gen)
        publisher.publish(version, version - 1, digest, pieces_from_states(layout, state, new))
        digest = WeightsDigest.parse(store.manifest(version).weights_digest)
        state = new
    return store, layout, snapshot


def _boundary_at(tp: int, store: DeltaStore, layout: ModelLayout, snapshot: Path, versions: int,
                 seed: int) -> dict[str, Any]:
    """Time the boundary both ways at tensor parallelism ``tp`` (see the module docs); version 1 warms up."""
    from workers.vllm.engine import VllmEngine

    t0 = time.perf_counter()
    engine = VllmEngine(snapshot, layout, seed=seed, version=0, tensor_parallel_size=tp)
    startup_s = time.perf_counter() - t0
    records = []
    try:
        target = engine.target
        follower = Follower(BucketChain(store))
        follower.attach(target)
        engine.generate(["1+1="], 1, 4, 1.0, seed=0)
        for version in range(1, versions + 1):
            t0 = time.perf_counter()
            staged = follower.stage(Step(version))
            t1 = time.perf_counter()
            if follower.held_remotely != version:
                raise AssertionError(f"the workers did not stage version {version}")
            calls, sent = target.rpc_calls.copy(), target.rpc_bytes.copy()
            t2 = time.perf_counter()
            if not follower.activate(staged):
                raise AssertionError(f"version {version} did not activate")
            engine.weights_changed()
            t3 = time.perf_counter()
            after_rpc = {k: target.rpc_bytes[k] - sent[k] for k in target.rpc_calls if target.rpc_calls[k] - calls[k]}
            scatter_s = target.last_scatter_s
            _check(engine, WeightsDigest.parse(staged.weights_digest), f"held activation of version {version}")
            # The push path with the same elements: writes the values they already hold (digest unchanged).
            sent = target.rpc_bytes.copy()
            t4 = time.perf_counter()
            for update in staged.updates:
                target.scatter(update.tensor, update.indices, update.bits)
            target.flush()
            engine.weights_changed()
            t5 = time.perf_counter()
            before_rpc = {k: n - sent[k] for k, n in target.rpc_bytes.items() if n - sent[k]}
            _check(engine, WeightsDigest.parse(staged.weights_digest), f"pushing version {version} again")
            records.append({"version": version, "changed": staged.manifest.changed_total,
                            "stage_s": t1 - t0, "held_stage_s": target.last_held_stage_s,
                            "boundary_s": t3 - t2, "boundary_before_s": t5 - t4, "worker_scatter_s": scatter_s,
                            "boundary_rpc_bytes": after_rpc, "boundary_before_rpc_bytes": before_rpc})
    finally:
        engine.close()
    timed = records[1:] or records
    median = lambda key: statistics.median(r[key] for r in timed)  # noqa: E731
    return {"engine_startup_s": startup_s, "changed": median("changed"), "stage_s": median("stage_s"),
            "held_stage_s": median("held_stage_s"), "boundary_s": median("boundary_s"),
            "boundary_before_s": median("boundary_before_s"), "worker_scatter_s": median("worker_scatter_s"),
            "per_version": records}


def run_boundary(config: dict[str, Any] | None = None, tps: Sequence[int] = (1, 2), versions: int = 3,
                 density: float = 0.02, seed: int = 0, segment_bytes: int = 4 << 20) -> dict[str, Any]:
    """The batch boundary before (push) and after (held in the workers) at each of ``tps`` (module docs)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the one JSON object
    config = dict(config or QWEN3_06B_CONFIG)
    out: dict[str, Any] = {"bench": "activate", "engine": "vllm", "mode": "boundary", "density": density,
                           "versions": versions, "timed_versions": max(versions - 1, 1)}
    with tempfile.TemporaryDirectory(prefix="aurora-bench-boundary-") as tmp:
        t0 = time.perf_counter()
        store, layout, snapshot = _publish_run(Path(tmp), config, versions, density, seed, segment_bytes)
        out["publish_s"] = time.perf_counter() - t0
        out["model"] = {"config": config, "parameters": layout.numel, "bf16_bytes": layout.nbytes}
        for tp in tps:
            result = _boundary_at(tp, store, layout, snapshot, versions, seed)
            out[f"tp{tp}"] = result
            out[f"boundary_vs_worker_scatter_tp{tp}"] = result["boundary_s"] / result["worker_scatter_s"]
            out[f"boundary_vs_worker_scatter_tp{tp}_before"] = (result["boundary_before_s"]
                                                                / result["worker_scatter_s"])
        store.close()
    out["bit_exact"] = True  # every version's weights were hashed inside the workers and matched its digest
    out["torch_threads"] = torch.get_num_threads()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``activate`` subcommand's options (shared by ``python -m benchmarks activate``)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--engine", choices=["vllm"], default="vllm", help="the engine measured (vLLM only)")
    parser.add_argument("--reload", action="store_true",
                        help="in place vs a full reload_weights instead of the batch boundary before/after")
    parser.add_argument("--size", choices=sorted(BOUNDARY_SIZES), default="qwen3-0.6b",
                        help="boundary: the model's shapes")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="boundary: tensor-parallel sizes")
    parser.add_argument("--density", type=float, default=0.02, help="boundary: fraction of elements changed")
    parser.add_argument("--versions", type=int, default=None,
                        help="consecutive versions (boundary: 3, the first warms up; reload: 4)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--medium", action="store_true", help="reload: a ~0.16 B-parameter model instead of ~15 M")
    parser.add_argument("--in-process", action="store_true", help="reload: engine core in this process")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    if not args.reload:
        return run_boundary(BOUNDARY_SIZES[args.size], tps=args.tp, versions=args.versions or 3,
                            density=args.density)
    return run(MEDIUM_CONFIG if args.medium else None, versions=args.versions or 4, lr=args.lr,
               warmup=args.warmup, multiprocess=not args.in_process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.activate", description=__doc__.split("\n")[0])
    add_arguments(parser)
    json.dump(run_from_args(parser.parse_args(argv)), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":  # vLLM's engine process is spawned and re-imports the main module
    raise SystemExit(main())
