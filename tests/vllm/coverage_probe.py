"""``python -m tests.vllm.coverage_probe OUT FAMILY…``: for each family, save a tiny random model in
``OUT/FAMILY``, load it with vLLM (in-process engine, one after the other in this one process) and save the
parameters vLLM's own loaders produced in ``OUT/FAMILY.engine/params.safetensors``; then attach the codec's
layout as an actor does (``aurora_attach``). Prints one JSON line: family → attach problems and the parameters
vLLM repacked after loading, or the error that stopped vLLM. Run by ``test_layout_coverage`` (the comparison
itself happens there).

vLLM's CPU MoE backends repack ``w13_weight`` / ``w2_weight`` into a blocked layout after loading
(``process_weights_after_loading`` → ``cpu_prepack_moe_weight``: same shape, elements permuted). The probe
records each expert layer's tensors as the loaders left them, just before that step, so the proof compares
the layout with vLLM's loaders; then it reads every layout tensor back and hashes the weights through the
actor's binding (``aurora_read``, ``aurora_digest``), which must see through the repack to the loaders' order."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from aurora_store.codec import ModelLayout
from tests.vllm.tiny_families import config_of, save_tiny

#: (module, parameter name) → the tensor as vLLM's loaders left it, before the CPU MoE repack.
_LOADED: dict[tuple[int, str], torch.Tensor] = {}


def _record_before_repack() -> None:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    original = CPUUnquantizedExperts.process_weights_after_loading
    if getattr(original, "_probe", False):
        return

    def recording(self, layer: torch.nn.Module) -> None:
        for name in ("w13_weight", "w2_weight"):
            _LOADED[(id(layer), name)] = getattr(layer, name).detach().clone()
        original(self, layer)

    recording._probe = True  # type: ignore[attr-defined]
    CPUUnquantizedExperts.process_weights_after_loading = recording  # type: ignore[method-assign]


def _engine_params(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    params, repacked = {}, []
    for full, param in model.named_parameters():  # a tied tensor once, as the engine's binding sees it
        module_name, _, name = full.rpartition(".")
        loaded = _LOADED.get((id(model.get_submodule(module_name)), name))
        if loaded is not None:
            repacked.append(full)
        params[full] = (param.detach() if loaded is None else loaded).clone().contiguous()
    return params, sorted(repacked)


def probe(out: Path, family: str) -> dict[str, list[str]]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    from workers.vllm.backend import register
    from workers.vllm.wire import EXTENSION_PATH

    register()
    _record_before_repack()
    directory = save_tiny(family, out / family)
    # Only loading matters here: one sequence of 64 tokens keeps vLLM's profiling and warm-up passes tiny.
    llm = LLM(model=str(directory), dtype="bfloat16", enforce_eager=True, max_model_len=64, seed=0,
              max_num_seqs=1, max_num_batched_tokens=64, skip_tokenizer_init=True,
              worker_extension_cls=EXTENSION_PATH)
    try:
        params, repacked = llm.apply_model(_engine_params)[0]
        (out / f"{family}.engine").mkdir()
        save_file(params, str(out / f"{family}.engine" / "params.safetensors"))
        layout = ModelLayout.from_config(config_of(family))
        problems = sorted({p for rank in llm.collective_rpc("aurora_attach", args=(layout.to_json(),)) for p in rank})
        result: dict[str, object] = {"attach_problems": problems, "repacked": repacked}
        if not problems:
            # What the actor reads and hashes through its binding (for repacked experts: through the permutation
            # read off vLLM's packing), to compare with the loaders' own output.
            read = llm.collective_rpc("aurora_read", args=(layout.names,))[0]
            save_file({n: torch.frombuffer(bytearray(b), dtype=torch.int16) for n, b in zip(layout.names, read)},
                      str(out / f"{family}.engine" / "read.safetensors"))
            result["digest"] = llm.collective_rpc("aurora_digest")[0]
        return result
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    torch.set_num_threads(1)
    root = Path(sys.argv[1])
    results: dict[str, object] = {}
    for name in sys.argv[2:]:
        try:
            results[name] = probe(root, name)
        except Exception as exc:  # reported per family: one that vLLM cannot load must not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    print(json.dumps(results))
