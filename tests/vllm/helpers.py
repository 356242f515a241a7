"""Helpers shared by the vLLM tests: reading an engine's weights, the trainer-side reference, and the actor's
own staging path (fetch, verify, decode, digest check, then one in-place activation)."""

from __future__ import annotations

import time
from typing import Any

import torch

from aurora_store.codec import activate
from aurora_store.codec.layout import ModelLayout, bits_view
from aurora_store.store.replay import stage_version
from workers.rl.model import load_model

#: Versions published after the snapshot (v0) in the session's published run (see conftest).
CHAIN = 6

SHORT = ["12+7=", "3+45=", "20+20=", "9+9=", "31+8=", "0+0=", "44+5=", "17+26="]
#: Longer than one KV block (the engine fixture uses 32-token blocks): their first block is cached at v0 and
#: must not be reused once the weights changed.
LONG = ["1+2+3+4+5+6+7+8+9+10+11+12+13+14+15=", "40+41+42+43+44+45+46+47+48+49+50="]
PROMPTS = SHORT + LONG
MAX_NEW = 6


def engine_bits(engine, layout: ModelLayout) -> dict[str, torch.Tensor]:
    """Every layout tensor's bits, read back from inside the engine."""
    return engine.target.read(layout.names)


def fused_bits(layout: ModelLayout, state) -> dict[str, torch.Tensor]:
    """The trainer-side weights in vLLM's fused layout, as bits."""
    return {name: bits_view(t) for name, t in layout.fuse(state).items()}


def apply_chain(engine, store, versions) -> list[dict[str, Any]]:
    """Stage and activate ``versions`` as the actor does; RPC counts and seconds per version."""
    target = engine.target
    records = []
    for version in versions:
        before = dict(target.rpc_calls)
        t0 = time.perf_counter()
        staged = stage_version(store, version, target)
        t1 = time.perf_counter()
        activate(staged, target)
        engine.weights_changed()
        t2 = time.perf_counter()
        calls = {k: v - before.get(k, 0) for k, v in target.rpc_calls.items() if v - before.get(k, 0)}
        records.append({"version": version, "stage_s": t1 - t0, "activate_s": t2 - t1, "rpc": calls,
                        "changed_tensors": len(staged.updates)})
    return records


def hf_model_at(run, version: int):
    """transformers' model (bf16) loaded from the snapshot directory, at ``version``'s published weights."""
    model = load_model(run.snapshot_dir, dtype=torch.bfloat16).eval()
    missing, unexpected = model.load_state_dict(run.states[version], strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model


def hf_greedy(model, tokenizer, prompt: str, max_new: int) -> tuple[list[int], list[float]]:
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    ids = out.sequences[0, enc.input_ids.shape[1]:].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, ids)]
    return ids, logprobs
