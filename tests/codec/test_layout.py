import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.codec import ModelLayout
from aurora_store.errors import LayoutError, UnsupportedDtypeError

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "qwen3_tied": ("Qwen3Config", "Qwen3ForCausalLM",
                   dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        intermediate_size=96, num_hidden_layers=2, vocab_size=128, tie_word_embeddings=True)),
    "qwen3_untied": ("Qwen3Config", "Qwen3ForCausalLM",
                     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          intermediate_size=96, num_hidden_layers=2, vocab_size=128, tie_word_embeddings=False)),
    "qwen2_bias": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=96, num_hidden_layers=2, vocab_size=128, tie_word_embeddings=True)),
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=96, num_hidden_layers=2, vocab_size=128)),
    "llama_bias": ("LlamaConfig", "LlamaForCausalLM",
                   dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                        mlp_bias=True, intermediate_size=96, num_hidden_layers=1, vocab_size=128)),
}


def hf_model(kind):
    config_cls, model_cls, kwargs = CONFIGS[kind]
    config = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
    return config, model


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_layout_covers_every_parameter_of_the_real_model_exactly_once(kind):
    config, model = hf_model(kind)
    layout = ModelLayout.from_config(config.to_dict())
    state = model.state_dict()
    layout.check_state(state)  # raises on anything missing, extra or mis-shaped
    params = dict(model.named_parameters())  # shared (tied) tensors appear once here
    shipped = set(layout.train_names)
    assert shipped == set(params), "every distinct parameter is shipped exactly once"
    assert layout.numel == sum(p.numel() for p in params.values())


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_fuse_then_split_is_bit_exact_and_stacks_q_k_v_in_order(kind):
    config, model = hf_model(kind)
    layout = ModelLayout.from_config(config.to_dict())
    state = model.state_dict()
    fused = layout.fuse(state)
    qkv = fused["model.layers.0.self_attn.qkv_proj.weight"]
    q = state["model.layers.0.self_attn.q_proj.weight"]
    k = state["model.layers.0.self_attn.k_proj.weight"]
    v = state["model.layers.0.self_attn.v_proj.weight"]
    assert torch.equal(qkv, torch.cat([q, k, v]))
    gate_up = fused["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(gate_up[: config.intermediate_size], state["model.layers.0.mlp.gate_proj.weight"])
    # fused flat index = (row_offset + r) * in_features + c
    r, c = 3, 5
    tensor = layout["model.layers.0.self_attn.qkv_proj.weight"]
    k_comp = tensor.components[1]
    flat = (k_comp.row_offset + r) * tensor.row_size + c
    assert qkv.view(-1)[flat].view(torch.int16) == k[r, c].view(torch.int16)
    back = layout.split(fused)
    for name in layout.train_names:
        assert torch.equal(back[name].view(torch.int16), state[name].view(torch.int16)), name


def test_a_silently_dropped_tensor_is_an_error():
    config, model = hf_model("qwen3_tied")
    layout = ModelLayout.from_config(config.to_dict())
    state = dict(model.state_dict())
    del state["model.layers.1.self_attn.v_proj.weight"]
    with pytest.raises(LayoutError, match="missing"):
        layout.check_state(state)


def test_unexpected_misshaped_and_mistyped_tensors_are_errors():
    config, model = hf_model("qwen3_untied")
    layout = ModelLayout.from_config(config.to_dict())
    state = dict(model.state_dict())
    with pytest.raises(LayoutError, match="unexpected"):
        layout.check_state({**state, "model.extra.weight": torch.zeros(2, dtype=torch.bfloat16)})
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(LayoutError, match="shape"):
        layout.check_state(bad)
    bad = dict(state)
    bad["model.norm.weight"] = bad["model.norm.weight"].half()
    with pytest.raises(LayoutError, match="dtype"):
        layout.check_state(bad)


def test_tied_lm_head_is_accepted_but_never_shipped_and_must_really_be_tied():
    config, model = hf_model("qwen3_tied")
    layout = ModelLayout.from_config(config.to_dict())
    assert "lm_head.weight" not in layout
    assert "lm_head.weight" not in layout.train_names
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    layout.check_state(state)
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(LayoutError, match="tied"):
        layout.check_state(state)


def test_fingerprint_identifies_the_layout():
    base = CONFIGS["qwen3_tied"][2] | {"model_type": "qwen3"}
    a = ModelLayout.from_config(base)
    assert a.fingerprint == ModelLayout.from_config(dict(base)).fingerprint
    assert a.fingerprint != ModelLayout.from_config(base | {"num_key_value_heads": 4}).fingerprint
    assert ModelLayout.from_json(a.to_json()) == a
    assert ModelLayout.from_json(a.to_json()).fingerprint == a.fingerprint


def test_bad_configs_are_rejected():
    with pytest.raises(LayoutError, match="model_type"):
        ModelLayout.from_config({"model_type": "gpt2"})
    with pytest.raises(LayoutError, match="required"):
        ModelLayout.from_config({"model_type": "qwen3", "hidden_size": 8})
    with pytest.raises(LayoutError):
        ModelLayout.from_json({"format": "aurora.layout/99", "tensors": []})


@given(st.dictionaries(st.text("abcdef.", min_size=1, max_size=8),
                       st.lists(st.integers(1, 5), min_size=0, max_size=3), min_size=1, max_size=5))
def test_identity_layout_roundtrips_any_bf16_state(shapes):
    state = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}
    layout = ModelLayout.identity(state)
    layout.check_state(state)
    assert ModelLayout.from_json(layout.to_json()) == layout


def test_identity_layout_rejects_non_16_bit_dtypes():
    with pytest.raises(UnsupportedDtypeError):
        ModelLayout.identity({"w": torch.zeros(3, dtype=torch.float32)})
    with pytest.raises(TypeError):  # UnsupportedDtypeError is also a TypeError
        ModelLayout.identity({"w": torch.zeros(3, dtype=torch.int8)})
