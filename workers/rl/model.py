"""The policy model: a Qwen3-architecture decoder (or a preset of another family) built from a config in the
repository (no downloads), its warm start, and the files that make a snapshot directory loadable by
transformers and vLLM."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from aurora_store.errors import ConfigError
from workers.rl.task import VOCAB_SIZE, AdditionTask

#: Small enough for two CPU cores, shaped like the real thing (GQA, q/k norms, tied embeddings).
#: head_dim 32 is one of the head sizes vLLM's CPU backend supports.
DEFAULT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "vocab_size": VOCAB_SIZE, "max_position_embeddings": 64, "tie_word_embeddings": True, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu",
    "attention_bias": False, "torch_dtype": "bfloat16",
}

#: The same small model as a mixture of experts (Qwen3-MoE): every layer sparse, 8 experts of which 2 are
#: active per token, an expert's intermediate size a multiple of 32 (vLLM's CPU expert kernels' block), and
#: the router's load-balancing loss in the training loss as transformers computes it.
MOE_OVERRIDES: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "output_router_logits": True, "router_aux_loss_coef": 0.01,
}
#: The same small model as DeepSeek-V3 (multi-head latent attention + MoE): layer 0 dense
#: (``first_k_dense_replace``), layer 1 routed (4 experts, 2 active, one shared) with the score-corrected router
#: (``noaux_tc``: its bias is a buffer, never trained). The latent dims are DeepSeek's own (kv_lora_rank 512 +
#: rope 64 = 576, the one head size vLLM's CPU MLA decode kernel takes); per-head nope/v dims stay small. Its router
#: has no load-balancing loss in transformers (DeepSeek balances through that bias instead).
DEEPSEEK_OVERRIDES: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "kv_lora_rank": 512, "q_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "head_dim": 64, "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
#: ``--model-config`` names for built-in variants of :data:`DEFAULT_CONFIG`.
PRESETS: dict[str, dict[str, Any]] = {"qwen3": {}, "qwen3_moe": MOE_OVERRIDES, "deepseek_v3": DEEPSEEK_OVERRIDES}


def built_in_config(overrides: str | None = None) -> dict[str, Any]:
    """:data:`DEFAULT_CONFIG` with ``overrides`` over it: a preset name (:data:`PRESETS`), inline JSON, or a JSON
    file (a preset's fields first when the JSON names one under ``"preset"``); a
    :class:`~aurora_store.errors.ConfigError` otherwise."""
    config = dict(DEFAULT_CONFIG)
    if not overrides:
        return config
    if overrides in PRESETS:
        return {**config, **PRESETS[overrides]}
    path = Path(overrides)
    try:
        text = path.read_text() if not overrides.lstrip().startswith("{") and path.is_file() else overrides
        fields = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read --model-config {overrides!r} (a preset: {sorted(PRESETS)}, inline JSON "
                          f"or a JSON file): {exc}") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"--model-config {overrides!r} is not a JSON object")
    preset = fields.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"--model-config names an unknown preset {preset!r}; one of {sorted(PRESETS)}")
    return {**config, **PRESETS.get(preset or "qwen3", {}), **fields}


def hf_config(config: dict[str, Any]):
    from transformers import AutoConfig

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype")}
    return AutoConfig.for_model(config["model_type"], **kwargs)


def build_model(config: dict[str, Any], seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(config), dtype=dtype)
    model.generation_config.top_k = None
    model.generation_config.top_p = None
    return model


def load_model(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def warm_start(model, tokenizer, task: AdditionTask, steps: int, *, lr: float = 3e-3, batch: int = 64,
               seed: int = 0) -> float:
    """Briefly teach the output format with supervised steps, so RL starts from a policy that sometimes
    succeeds (GRPO learns nothing from groups that all fail). Returns the last loss."""
    rng = random.Random(seed)
    examples = task.examples(rng)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        texts = [p + a + tokenizer.eos_token for p, a in (next(examples) for _ in range(batch))]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        labels = enc.input_ids.clone()
        labels[enc.attention_mask == 0] = -100
        out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss_value = float(out.loss.detach())
    model.eval()
    return loss_value


def side_files(config: dict[str, Any], tokenizer) -> dict[str, bytes]:
    """``config.json``, tokenizer and generation config: what a snapshot directory needs besides weights."""
    files: dict[str, bytes] = {"config.json": json.dumps(
        {**hf_config(config).to_dict(), "architectures": config.get("architectures", ["Qwen3ForCausalLM"]),
         "torch_dtype": "bfloat16"}, indent=2, sort_keys=True).encode()}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            files[path.name] = path.read_bytes()
    files["generation_config.json"] = json.dumps({"bos_token_id": config["bos_token_id"],
                                                  "eos_token_id": config["eos_token_id"],
                                                  "pad_token_id": config["pad_token_id"]}).encode()
    return files


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
