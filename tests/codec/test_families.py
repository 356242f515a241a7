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


def test_name_sets_and_families_are_validated():
    with pytest.raises(LayoutError, match="name set"):
        ModelLayout.from_config(config_of("qwen3"), names="disk")  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="num_experts"):
        ModelLayout.from_config({**config_of("qwen3_moe"), "num_experts": None})



def test_an_adam_step_of_a_moe_model_applies_in_place_to_a_torch_actor_bit_for_bit():
    """A Qwen3-MoE trainer step (AdamW, router aux loss as transformers computes it) shipped as a delta in the
    in-memory layout (3-D expert tensors) and activated in place in another transformers model's parameters."""
    from aurora_store.codec import activate, digest_state, stage
    from aurora_store.testing.builders import blobs, encode

    config = {**config_of("qwen3_moe"), "output_router_logits": True, "router_aux_loss_coef": 0.01}
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
