"""Helpers shared by the vLLM tests: reading an engine's weights, the trainer-side reference, and the actor's
own staging path (fetch, verify, decode, digest check, then one in-place activation)."""

from __future__ import annotations

import time
from typing import Any

import torch

from aurora_store.codec import activate
from aurora_store.codec.layout import ModelLayout, bits_view
from aurora_store.follow.stage import stage_version
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
    ids, logprobs, _ = hf_greedy_with_logits(model, tokenizer, prompt, max_new)
    return ids, logprobs


def hf_greedy_with_logits(model, tokenizer, prompt: str, max_new: int
                          ) -> tuple[list[int], list[float], torch.Tensor]:
    """Greedy tokens, their logprobs (float32 softmax of the bf16 logits) and the bf16 logits of every step."""
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    ids = out.sequences[0, enc.input_ids.shape[1]:].tolist()
    logits = torch.stack([s[0] for s in out.scores])
    logprobs = [float(torch.log_softmax(s.float(), -1)[t]) for s, t in zip(logits, ids)]
    return ids, logprobs, logits


#: How far apart two bf16 implementations of the same network may put one logit, in units in the last place
#: (ulp) of the step's largest logit. bf16 keeps 8 significant bits, so one ulp of a value in [2^e, 2^(e+1)) is
#: 2^(e-7) — 0.0625 for logits in [8, 16). Each side rounds its logits to bf16 (one ulp apart at most for the
#: same real value), and the hidden state entering the last matmul already carries kernel-dependent roundings
#: (vLLM's fused RMSNorm/SiLU/rotary and oneDNN's blocked bf16 dot products, which differ between CPU families:
#: AVX512-BF16/AMX on Intel, AVX512-BF16 with other blocking on AMD EPYC) through every layer; logits are
#: sums over the hidden size, so those errors scale with the logits' magnitude, not with each logit's own. Four
#: ulps: one for the final roundings, three for what the model's layers carry.
LOGIT_ULPS = 4


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values at |x| (8 significant bits); the smallest normal's spacing at 0."""
    exponent = torch.floor(torch.log2(x.abs().float().clamp_min(torch.finfo(torch.bfloat16).tiny)))
    return torch.exp2(exponent - 7)


def logprob_tolerance(logits: torch.Tensor, logprobs, temperature: float = 1.0,
                      ulps: int = LOGIT_ULPS) -> torch.Tensor:
    """Per token, the most two bf16 implementations' logprobs of the same token can differ when every logit of
    the other side is within δ = ``ulps`` bf16 ulps of the step's largest |logit| (divided by the temperature) of
    these reference ``logits`` (one row per step) with reference ``logprobs``.

    A token's logprob is ``-log(1 + Σ_{i≠t} exp(z_i − z_t))``; moving every logit by at most δ moves each gap by
    at most 2δ, so the sum S = (1 − p)/p scales by at most e^{±2δ}, and the logprob moves by at most
    ``log(1 + (1 − p)(e^{2δ} − 1))`` one way or ``−log(1 − (1 − p)(1 − e^{−2δ}))`` the other — both ≤ 2δ, ≈ 2δ(1 − p):
    a confident token's logprob barely moves. A float32 allowance (1e-5) covers the two softmaxes themselves."""
    delta = ulps * bf16_ulp(logits.float().abs().amax(-1)) / temperature
    p = torch.as_tensor(logprobs, dtype=torch.float64).exp()
    delta = delta.double()
    up = torch.log1p((1 - p) * torch.expm1(2 * delta))
    down = -torch.log1p(-(1 - p) * -torch.expm1(-2 * delta))
    return torch.maximum(up, down) + 1e-5


def assert_logprobs_close(actual, reference, logits: torch.Tensor, temperature: float = 1.0, what=()) -> None:
    """``actual`` (e.g. vLLM's) within :func:`logprob_tolerance` of the ``reference`` token by token."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    reference = torch.as_tensor(reference, dtype=torch.float64)
    assert actual.shape == reference.shape, (what, actual, reference)
    bound = logprob_tolerance(logits, reference, temperature)
    diff = (actual - reference).abs()
    assert bool((diff <= bound).all()), (what, "logprob differences", diff.tolist(), "bounds", bound.tolist(),
                                         "largest logit per step", logits.float().abs().amax(-1).tolist())

