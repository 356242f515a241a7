"""Measure the trainer's peak memory on the CPU for one GRPO step (a child process of test_memory_plan.py).

``python -m tests.trainer.memory_probe '{"config": {...}, "settings": "new"|"old", "sequences": N, ...}'`` prints
one JSON line: ``{"peak_bytes": ...}``, the peak resident memory above the baseline taken just before the
model is built.

How it measures, and why it is robust: the parent starts this process with ``MALLOC_MMAP_THRESHOLD_=65536``
and ``MALLOC_ARENA_MAX=1``, so every tensor buffer above 64 KiB is its own ``mmap`` that glibc returns to the
kernel when the tensor is freed — resident memory then follows live tensor bytes (to a page) instead of
keeping freed heap around. Before each measurement a throwaway step of the same settings runs (lazy imports,
kernels' one-time buffers), then the kernel's peak-RSS counter is reset (``/proc/self/clear_refs`` ← ``5``)
and the baseline read; the peak is ``VmHWM − baseline`` after model build, published copy and two epochs of
the step. One thread, so no per-thread allocator caches.
"""

from __future__ import annotations

import gc
import json
import re
import sys

import torch


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+) kB", f.read()).group(1)) * 1024  # type: ignore[union-attr]


def _samples(n: int, prompt: int, completion: int, vocab: int, seed: int):
    from workers.rl.grpo import Sample

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, vocab, (prompt + completion,), generator=gen).tolist()
        logprobs = (-torch.rand(completion, generator=gen) * 3).tolist()
        out.append(Sample(tuple(ids[:prompt]), tuple(ids[prompt:]), tuple(logprobs), float(i % 2), f"g{i // 4}"))
    return out


def _step(config: dict, settings: str, sequences: int, prompt: int, completion: int) -> None:
    from workers.publish.ranks import Ranks
    from workers.rl.grpo import GRPOConfig
    from workers.rl.model import DEFAULT_CONFIG, build_model
    from workers.trainer.learner import ShardedLearner

    model = build_model({**DEFAULT_CONFIG, **config}, seed=0)
    published = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}  # the published rows
    old = settings == "old"
    # "bf16": the CUDA defaults (bf16 autocast, weight cache off) run on the CPU's autocast
    learner = ShardedLearner(model, GRPOConfig(lr=1e-4, epochs=2), Ranks(),
                             optimizer="adamw" if old else "adamw-bf16",
                             autocast=torch.bfloat16 if settings == "bf16" else None,
                             activation_checkpointing=not old, logits_chunk=0 if old else 256)
    learner.step(_samples(sequences, prompt, completion, config["vocab_size"], seed=1))
    del published


def main() -> None:
    args = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    tiny = {**args["config"], "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256}
    peaks = {}
    for settings in args["settings"]:  # one after another: every buffer of the last one has been unmapped
        _step(tiny, settings, 4, 8, 8)  # imports, one-time buffers of this path
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _status("VmRSS")
        _step(args["config"], settings, args["sequences"], args["prompt"], args["completion"])
        peaks[settings] = _status("VmHWM") - base
        gc.collect()
    print(json.dumps({"peak_bytes": peaks}))


if __name__ == "__main__":
    main()
