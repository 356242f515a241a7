"""The family table and its one rule engine, checked against transformers (no vLLM: see
tests/vllm/test_layout_coverage.py for the proof against vLLM's loaders): each family's layout ships every
parameter of a real transformers model exactly once, with in-memory names and with saved-checkpoint names."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from aurora_store.codec import ModelLayout, TensorTarget
from aurora_store.codec.families import FAMILIES, MODEL_TYPE_ALIASES
from aurora_store.errors import LayoutError
from tests.vllm.tiny_families import FAMILIES as TINY
from tests.vllm.tiny_families import config_of, save_tiny
from workers.rl.model import build_model


@pytest.mark.parametrize("family", sorted(TINY))
def test_each_family_ships_every_transformers_parameter_exactly_once(tmp_path, family):
    config = config_of(family)
    directory = save_tiny(family, tmp_path / family)
    memory = dict(build_model(config, dtype=torch.bfloat16).named_parameters())
    for names, state in (("memory", memory), ("checkpoint", load_file(str(directory / "model.safetensors")))):
        layout = ModelLayout.from_config(config, names=names)
        # A checkpoint also holds the engine-only constants (DeepSeek's float32 router bias): not weights.
        state = {n: t for n, t in state.items() if n not in {e.name for e in layout.engine_only}}
        layout.check_state(state)  # nothing missing, nothing unexpected, shapes and dtypes right
        layout.check_coverage(state)
        assert layout.numel == sum(t.numel() for n, t in state.items() if n not in dict(layout.aliases))
        back = layout.split(layout.fuse(state))
        assert all(torch.equal(back[n].view(torch.int16), state[n].view(torch.int16)) for n in layout.train_names)


def test_every_family_in_the_table_has_a_tiny_model():
    types = {config_of(f)["model_type"] for f in TINY}
    assert {MODEL_TYPE_ALIASES.get(t, t) for t in types} == set(FAMILIES)


def test_per_expert_stacking_puts_each_expert_where_its_3d_tensor_has_it(tmp_path):
    config = config_of("qwen3_moe")
    state = load_file(str(save_tiny("qwen3_moe", tmp_path / "m") / "model.safetensors"))
    layout = ModelLayout.from_config(config, names="checkpoint")
    w13 = layout["model.layers.1.mlp.experts.routed_experts.w13_weight"]
    assert (w13.stack_dims, w13.rows, w13.row_size) == (2, 4 * 128, 128)
    fused = layout.fuse(state)[w13.name]
    for e in range(4):
        gate = state[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"]
        up = state[f"model.layers.1.mlp.experts.{e}.up_proj.weight"]
        assert torch.equal(fused[e], torch.cat([gate, up]))
    # flat index of element (r, c) of expert e's up projection = (row_offset + r) * row_size + c
    comp = w13.components[2 * 3 + 1]
    assert comp.train_name.endswith("experts.3.up_proj.weight") and comp.row_offset == 3 * 128 + 64
    assert fused.reshape(-1)[(comp.row_offset + 5) * 128 + 7] == state[comp.train_name][5, 7]


def test_stack_dims_round_trip_and_dense_fingerprints_are_unchanged():
    moe = ModelLayout.from_config(config_of("mixtral"), names="checkpoint")
    assert ModelLayout.from_json(moe.to_json()) == moe
    dense = ModelLayout.from_config(config_of("qwen3"))
    assert all("stack_dims" not in t for t in dense.to_json()["tensors"])
    doc = moe.to_json()
    doc["tensors"][-3]["stack_dims"] = 9
    with pytest.raises(LayoutError, match="stack_dims"):
        ModelLayout.from_json(doc)


#: Every family's layout fingerprint as computed before components could carry an element order (commit
#: 70e8d3a): the new optional field must leave every existing layout document byte for byte as it was.
PINNED_FINGERPRINTS = {
    "gemma3/memory": "e242f877afdf3044aca37759cf38a59d8aa579b3a4e352323db8c478620ba814",
    "gemma3/checkpoint": "e242f877afdf3044aca37759cf38a59d8aa579b3a4e352323db8c478620ba814",
    "llama/memory": "170b6185ff875f3bd7704fc314672616c2f7b8db5847fa3a84cfacbbd7df3473",
    "llama/checkpoint": "170b6185ff875f3bd7704fc314672616c2f7b8db5847fa3a84cfacbbd7df3473",
    "mistral/memory": "c2b6a0ce7a5d890459ac0bfc61ef6b4110f17a2f2fa9201fb0246302e6371e63",
    "mistral/checkpoint": "c2b6a0ce7a5d890459ac0bfc61ef6b4110f17a2f2fa9201fb0246302e6371e63",
    "mixtral/memory": "82ccba768b0bc29e1f129ceee28b996958193da486fcbe4c7ac6c01e96eccef6",
    "mixtral/checkpoint": "2e8783bf2bf308dc46dd21ac18ffe77356463b9f49427407dc5c1b4e93d5185e",
    "olmo2/memory": "147dc91deaf0752e4889b56fec0c448a1112e493c423a4afe2821760e9c383ef",
    "olmo2/checkpoint": "147dc91deaf0752e4889b56fec0c448a1112e493c423a4afe2821760e9c383ef",
    "olmo3/memory": "147dc91deaf0752e4889b56fec0c448a1112e493c423a4afe2821760e9c383ef",
    "olmo3/checkpoint": "147dc91deaf0752e4889b56fec0c448a1112e493c423a4afe2821760e9c383ef",
    "phi3/memory": "c7338c5cff536d9171b22e31d766b82e9693dd3383fb9c3e4af338b7b6d6d218",
    "phi3/checkpoint": "c7338c5cff536d9171b22e31d766b82e9693dd3383fb9c3e4af338b7b6d6d218",
    "qwen2/memory": "62f115b6e761b211bc70fc7bfa190466e70ba0940be7d0e84db14db3d903bb7c",
    "qwen2/checkpoint": "62f115b6e761b211bc70fc7bfa190466e70ba0940be7d0e84db14db3d903bb7c",
    "qwen3/memory": "583b931b137968b42239ea35de121c6c75d8d8dea41b873bac71766cb5b4c50a",
    "qwen3/checkpoint": "583b931b137968b42239ea35de121c6c75d8d8dea41b873bac71766cb5b4c50a",
    "qwen3_moe/memory": "dcb09052ed55b8464c015881eac8ace25301ba85f11f42acb9d4ad46587010f9",
    "qwen3_moe/checkpoint": "8be7180b48fa38c48a8f816405ed62302def486bc7f4b710b56ecdc478ac556d",
    "default/memory": "6af36e1d1a1331b3427f3a1059bc726e10f3751365388ca1bc6bcd0f6f0a4679",
    "qwen3_moe_preset/memory": "e3686614e0e6816bb6b451c61957974df5fb2c529f0fa2ce58e1cb0430420ce6",
}


def test_existing_layout_fingerprints_are_unchanged():
    from workers.rl.model import DEFAULT_CONFIG, built_in_config

    configs = {"default": DEFAULT_CONFIG, "qwen3_moe_preset": built_in_config("qwen3_moe")}
    for key, pinned in PINNED_FINGERPRINTS.items():
        family, names = key.split("/")
        config = configs[family] if family in configs else config_of(family)
        assert ModelLayout.from_config(config, names=names).fingerprint == "sha256:" + pinned, key


def test_gpt_oss_experts_are_the_transpose_of_each_expert_with_gate_and_up_still_alternating(tmp_path):
    """vLLM's w13 [E, 2I, H] is transformers' gate_up_proj [E, H, 2I] transposed per expert, its gate and up
    rows still alternating (vLLM's swigluoai reads x[..., ::2], x[..., 1::2]); w2 is down_proj transposed; the
    biases, router and sinks are shipped as they are, under vLLM's names (attn, embedding)."""
    config = config_of("gpt_oss")
    state = load_file(str(save_tiny("gpt_oss", tmp_path / "m") / "model.safetensors"))
    layout = ModelLayout.from_config(config)
    assert layout.train_names == ModelLayout.from_config(config, names="checkpoint").train_names
    fused = layout.fuse(state)
    p = "model.layers.1."
    gate_up, down = state[p + "mlp.experts.gate_up_proj"], state[p + "mlp.experts.down_proj"]
    w13 = fused[p + "mlp.experts.routed_experts.w13_weight"]
    assert w13.shape == (4, 512, 128) and torch.equal(w13, gate_up.transpose(1, 2))
    assert torch.equal(w13[2, 0::2], gate_up[2, :, 0::2].T)  # gate rows alternate with up rows
    assert torch.equal(fused[p + "mlp.experts.routed_experts.w2_weight"], down.transpose(1, 2))
    for engine, train in (("mlp.experts.routed_experts.w13_bias", "mlp.experts.gate_up_proj_bias"),
                          ("mlp.experts.routed_experts.w2_bias", "mlp.experts.down_proj_bias"),
                          ("mlp.router.weight", "mlp.router.weight"), ("mlp.router.bias", "mlp.router.bias"),
                          ("attn.sinks", "self_attn.sinks"), ("attn.o_proj.bias", "self_attn.o_proj.bias")):
        assert torch.equal(fused[p + engine], state[p + train]), engine
    assert torch.equal(fused["model.embedding.weight"], state["model.embed_tokens.weight"])
    # flat index of element (r, c) of expert e's block = (row_offset + e) * row_size + r * H + c, read from the
    # trainer's tensor at [e, c, r]
    tensor = layout[p + "mlp.experts.routed_experts.w13_weight"]
    assert tensor.row_size == 512 * 128
    assert w13.reshape(-1)[3 * tensor.row_size + 7 * 128 + 5] == gate_up[3, 5, 7]


def test_name_sets_and_families_are_validated():
    with pytest.raises(LayoutError, match="name set"):
        ModelLayout.from_config(config_of("qwen3"), names="disk")  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="num_experts"):
        ModelLayout.from_config({**config_of("qwen3_moe"), "num_experts": None})



@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_an_adam_step_of_a_moe_model_applies_in_place_to_a_torch_actor_bit_for_bit(family):
    """A MoE trainer step (AdamW, router aux loss as transformers computes it) shipped as a delta in the
    in-memory layout (3-D expert tensors) and activated in place in another transformers model's parameters —
    for gpt-oss through the element order's position map into its transposed expert tensors."""
    from aurora_store.codec import activate, digest_state, stage
    from aurora_store.testing.builders import blobs, encode

    config = {**config_of(family), "output_router_logits": True, "router_aux_loss_coef": 0.01}
    layout = ModelLayout.from_config(config)
    trainer = build_model(config, seed=1)  # fp32 master weights
    actor = build_model(config, seed=1, dtype=torch.bfloat16)

    def published() -> dict[str, torch.Tensor]:
        params = dict(trainer.named_parameters())
        return {n: params[n].detach().to(torch.bfloat16).contiguous() for n in layout.train_names}

    old = published()
    actor_params = dict(actor.named_parameters())
    with torch.no_grad():
        for name, tensor in old.items():
            actor_params[name].copy_(tensor)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-3)
    ids = torch.randint(3, 32, (4, 12), generator=torch.Generator().manual_seed(0))
    out = trainer(input_ids=ids, labels=ids)
    # the router's load-balancing loss is part of the loss
    assert out.aux_loss is not None and float(out.aux_loss.detach()) > 0
    out.loss.backward()
    optimizer.step()
    new = published()
    target = TensorTarget.from_state(layout, actor_params, version=0)
    assert target.digest == digest_state(layout, old)
    manifest, segments = encode(layout, old, new, 1, 0, target.digest)
    changed_experts = manifest.changed.get("model.layers.1.mlp.experts.routed_experts.w13_weight", 0)
    assert changed_experts > 0
    activate(stage(manifest, blobs(segments), target), target)
    assert str(target.digest) == manifest.weights_digest == str(digest_state(layout, new))
    for name in layout.train_names:
        assert torch.equal(actor_params[name].view(torch.int16), new[name].view(torch.int16)), name
