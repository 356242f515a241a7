"""``python -m benchmarks activate``: activating a version inside vLLM, in place vs a full reload.

One vLLM engine (engine core in its own process, as actors run it) is bootstrapped from a snapshot; then,
for each of a chain of realistic Adam-step versions, the same version is made live twice:

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
from aurora_store.errors import DigestMismatchError
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``activate`` subcommand's options (shared by ``python -m benchmarks activate``)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--versions", type=int, default=4, help="consecutive versions to activate both ways")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--medium", action="store_true", help="a ~0.16 B-parameter model instead of ~15 M")
    parser.add_argument("--in-process", action="store_true", help="engine core in this process (no RPC hop)")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run(MEDIUM_CONFIG if args.medium else None, versions=args.versions, lr=args.lr, warmup=args.warmup,
               multiprocess=not args.in_process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.activate", description=__doc__.split("\n")[0])
    add_arguments(parser)
    json.dump(run_from_args(parser.parse_args(argv)), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":  # vLLM's engine process is spawned and re-imports the main module
    raise SystemExit(main())
