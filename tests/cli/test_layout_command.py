"""``aurora layout --config``: prints every engine tensor and the fingerprint a run would carry; refuses an
architecture without a layout with its reason."""

from __future__ import annotations

import json

from aurora_store.cli import main
from aurora_store.codec import ModelLayout

MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
       "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "tie_word_embeddings": False}


def test_prints_the_layout_and_its_fingerprint(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(MOE))
    assert main(["layout", "--config", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    layout = ModelLayout.from_config(MOE)
    assert layout.fingerprint in out.splitlines()[-1]
    assert ("model.layers.1.mlp.experts.routed_experts.w13_weight  [8, 64, 64]  ← "
            "model.layers.1.mlp.experts.gate_up_proj") in out
    assert ("model.layers.0.self_attn.qkv_proj.weight  [128, 64]  ← model.layers.0.self_attn.q_proj.weight + "
            "model.layers.0.self_attn.k_proj.weight + model.layers.0.self_attn.v_proj.weight") in out
    assert len(out.splitlines()) == len(layout.tensors) + 1


def test_a_component_in_an_order_of_its_own_says_so(tmp_path, capsys):
    gpt_oss = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 48, "num_local_experts": 4,
               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "vocab_size": 100, "attention_bias": True}
    (tmp_path / "config.json").write_text(json.dumps(gpt_oss))
    assert main(["layout", "--config", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert ("model.layers.0.mlp.experts.routed_experts.w13_weight  [4, 96, 64]  ← "
            "model.layers.0.mlp.experts.gate_up_proj [4, 64, 96] as [4, 64, 96], axes [0, 2, 1]") in out
    assert "model.embedding.weight  [100, 64]  ← model.embed_tokens.weight\n" in out
    assert "model.layers.0.attn.sinks  [4]  ← model.layers.0.self_attn.sinks\n" in out


def test_json_with_checkpoint_names_round_trips(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(MOE))
    assert main(["layout", "--config", str(tmp_path / "config.json"), "--names", "checkpoint", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    layout = ModelLayout.from_json(doc["layout"])
    assert layout == ModelLayout.from_config(MOE, names="checkpoint")
    assert doc["fingerprint"] == layout.fingerprint != ModelLayout.from_config(MOE).fingerprint
    w13 = layout["model.layers.1.mlp.experts.routed_experts.w13_weight"]
    assert [c.train_name for c in w13.components[:2]] == ["model.layers.1.mlp.experts.0.gate_proj.weight",
                                                          "model.layers.1.mlp.experts.0.up_proj.weight"]


def test_refuses_a_model_without_a_layout_with_the_reason(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**MOE, "model_type": "deepseek_v2"}))
    assert main(["layout", "--config", str(tmp_path / "config.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not proven against vLLM" in err[0] and err[0].startswith("aurora layout: error:")
    assert main(["layout", "--config", str(tmp_path / "missing.json")]) == 2
