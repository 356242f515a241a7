"""``python -m benchmarks vllm_backend``: one update's write into vLLM — the ``aurora`` backend's in-place
scatter vs vLLM's own NaN-masked sparse patch path, for the same delta, on the same engine.

A vLLM engine (in process, CPU build) is started with ``weight_transfer_config={"backend": "aurora"}`` from
the snapshot of a local run (a chain of realistic Adam-step versions); it follows the chain through vLLM's
``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` (end-to-end seconds per version:
manifest, fetch, verify, decode, digest check, scatter). Then, inside the worker, every version's delta is
written both ways from its base weights:

* **aurora** — :func:`workers.vllm.worker.scatter_in_place`: fused flat indices + 16-bit patterns written
  into vLLM's fused parameters with ``index_put_`` (O(changed));
* **nan_patch** — ``vllm.model_executor.model_loader.checkpoint_weight_patch.load_checkpoint_weight_patches``
  with sparse ``CheckpointWeightPatch`` es in checkpoint coordinates (per HF tensor: flat indices + bf16
  values): vLLM stages a full checkpoint-shaped NaN tensor per patch and runs the model's ``load_weights``
  with a NaN-masked ``copy_`` (O(model)).

After every write the engine's weights are hashed and must equal the version's digest (both paths are
bit-exact here because no new value is NaN; the NaN path cannot carry one). Ratios are measured in the same
run beside absolute seconds (these machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import ModelLayout, pieces_from_states
from aurora_store.codec.digest import digest_state
from aurora_store.codec.layout import bits_view
from aurora_store.errors import DigestMismatchError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshots import load_snapshot, write_snapshot
from benchmarks.activate import ACTIVATE_BENCH_CONFIG, MEDIUM_CONFIG
from benchmarks.synthetic import chained_states

Update = tuple[str, torch.Tensor, torch.Tensor]  # fused name, flat indices, int16 bits


def fused_delta(layout: ModelLayout, old, new) -> tuple[list[Update], list[Update]]:
    """``(forward, backward)`` updates in fused coordinates: new bits at changed indices, and the old ones."""
    fwd, back = [], []
    old_f, new_f = layout.fuse(old), layout.fuse(new)
    for tensor in layout.tensors:
        o, n = bits_view(old_f[tensor.name]), bits_view(new_f[tensor.name])
        idx = torch.ne(o, n).nonzero().flatten()
        if idx.numel():
            fwd.append((tensor.name, idx, n[idx].contiguous()))
            back.append((tensor.name, idx, o[idx].contiguous()))
    return fwd, back


def checkpoint_patches(layout: ModelLayout, old, new) -> list:
    """The same delta as vLLM's sparse checkpoint patches (HF names, per-tensor flat indices, bf16 values)."""
    from vllm.model_executor.model_loader.checkpoint_weight_patch import CheckpointWeightPatch

    patches = []
    for name in layout.train_names:
        o, n = old[name].reshape(-1), new[name].reshape(-1)
        idx = torch.ne(bits_view(o), bits_view(n)).nonzero().flatten()
        if idx.numel():
            patches.append(CheckpointWeightPatch(name, tuple(new[name].shape), new[name].dtype, n[idx].clone(), idx))
    return patches


def run(config: dict[str, Any] | None = None, versions: int = 3, lr: float = 1e-6, warmup: int = 4,
        seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the one JSON object
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker is reached with in-process callables
    for key, value in {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
        os.environ.setdefault(key, value)
    from vllm import LLM
    from vllm.model_executor.model_loader.checkpoint_weight_patch import load_checkpoint_weight_patches

    from workers.rl.model import side_files
    from workers.rl.task import build_tokenizer
    from workers.vllm import backend as vllm_backend

    vllm_backend.register()  # what the vllm.general_plugins entry point does in an installed package
    config = dict(config or ACTIVATE_BENCH_CONFIG)
    layout = ModelLayout.from_config(config)
    states = chained_states(layout, versions, lr=lr, seed=seed, warmup=warmup)
    digests = [digest_state(layout, s) for s in states]
    with tempfile.TemporaryDirectory(prefix="aurora-bench-backend-") as tmp:
        root = Path(tmp)
        store = DeltaStore(open_bucket(str(root / "bucket"), create=True))
        store.put_run_info({"run": "bench"})
        write_snapshot(store, 0, states[0], layout, digests[0],
                       extra_files=side_files(config, build_tokenizer()))
        publisher = VersionPublisher(store, layout, record_history=False)
        for v in range(1, versions + 1):
            publisher.publish(v, v - 1, digests[v - 1], pieces_from_states(layout, states[v - 1], states[v]))
        load_snapshot(store, 0, layout, download_dir=root / "v0")
        t0 = time.perf_counter()
        llm = LLM(model=str(root / "v0"), dtype="bfloat16", enforce_eager=True, max_model_len=128, seed=seed,
                  weight_transfer_config={"backend": "aurora"})
        startup_s = time.perf_counter() - t0
        try:
            llm.init_weight_transfer_engine({"init_info": {"bucket": str(root / "bucket"), "run": "bench"}})
            llm.generate(["1+1="], use_tqdm=False)  # first-call costs, untimed
            update_s = []
            for v in range(1, versions + 1):
                t0 = time.perf_counter()
                llm.start_weight_update()
                llm.update_weights({"update_info": {"version": v, "base_version": v - 1}})
                llm.finish_weight_update()
                update_s.append(time.perf_counter() - t0)
            records = llm.collective_rpc(lambda w: [dict(r.__dict__) for r in w.weight_transfer_engine.updates])[0]

            def compare(worker) -> list[dict[str, Any]]:
                engine = worker.weight_transfer_engine
                model, target = engine.model, engine.target

                def check(version: int, what: str) -> None:
                    actual = target.full_digest()
                    if actual != digests[version]:
                        raise DigestMismatchError(f"{what} of version {version}: {actual} != {digests[version]}")

                out = []
                # The engine is at the last version: walk the chain backwards, each delta from its own base.
                for v in range(versions, 0, -1):
                    fwd, back = fused_delta(layout, states[v - 1], states[v])
                    patches = checkpoint_patches(layout, states[v - 1], states[v])
                    aurora, nan = [], []
                    for _ in range(repeats):
                        target.write(back)  # to the base, untimed
                        check(v - 1, "restore")
                        t0 = time.perf_counter()
                        target.write(fwd)
                        aurora.append(time.perf_counter() - t0)
                        check(v, "aurora scatter")
                        target.write(back)
                        check(v - 1, "restore")
                        t0 = time.perf_counter()
                        load_checkpoint_weight_patches(model, patches)
                        nan.append(time.perf_counter() - t0)
                        check(v, "NaN-masked patch")
                    target.write(back)  # leave the engine at v - 1
                    changed = sum(int(i.numel()) for _, i, _ in fwd)
                    out.append({"version": v, "changed": changed, "density": changed / layout.numel,
                                "aurora_scatter_s": statistics.median(aurora), "nan_patch_s": statistics.median(nan),
                                "nan_patch_staging_bytes": sum(2 * math.prod(p.shape) for p in patches)})
                return out[::-1]

            per_version = llm.collective_rpc(compare)[0]
        finally:
            llm.llm_engine.engine_core.shutdown()
    for rec, e2e, upd in zip(per_version, update_s, records):
        rec.update({"backend_update_s": e2e, "backend_stage_s": upd["stage_s"],
                    "backend_activate_s": upd["activate_s"]})
    aurora_s = statistics.median(r["aurora_scatter_s"] for r in per_version)
    nan_s = statistics.median(r["nan_patch_s"] for r in per_version)
    return {
        "bench": "vllm_backend",
        "model": {"parameters": layout.numel, "bf16_bytes": layout.nbytes, "hidden": config["hidden_size"],
                  "layers": config["num_hidden_layers"], "vocab": config["vocab_size"]},
        "versions": versions, "lr": lr, "repeats": repeats,
        "density": statistics.median(r["density"] for r in per_version),
        "engine_startup_s": startup_s,
        "aurora_scatter_s": aurora_s,
        "nan_patch_s": nan_s,
        "nan_patch_vs_aurora_scatter": nan_s / aurora_s,
        "backend_update_s": statistics.median(update_s),
        "per_version": per_version,
        "bit_exact": True,  # every write was checked against the version's digest
        "torch_threads": torch.get_num_threads(),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed writes per version and path (median)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--medium", action="store_true", help="a ~0.16 B-parameter model instead of ~15 M")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run(MEDIUM_CONFIG if args.medium else None, versions=args.versions, lr=args.lr, repeats=args.repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_backend", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    result = run(MEDIUM_CONFIG if args.medium else None, versions=args.versions, lr=args.lr, repeats=args.repeats)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
