"""Tiny random models of every family the codec has a layout for (and of those it refuses), small enough that
vLLM's CPU build loads each in ~4 s. head_dim 32 is a head size vLLM's CPU attention supports; the vocabulary
(32) is padded by vLLM to 64 rows, which the proof must see through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from workers.rl.model import build_model
from workers.rl.task import VOCAB_SIZE, build_tokenizer

BASE: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
}
_SLIDING = {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}

#: family → config (on top of BASE). Each has something the others lack.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": True,
              "mlp_bias": True},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True},
    "gemma3": {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "tie_word_embeddings": True,
               "query_pre_attn_scalar": 32, **_SLIDING},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
    "olmo2": {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"]},
    "olmo3": {"model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], **_SLIDING},
    # Layer 0 dense (mlp_only_layers), layer 1 sparse: both kinds of Qwen3-MoE layer.
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1,
                  "mlp_only_layers": [0], "norm_topk_prob": True},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
                "num_experts_per_tok": 2},
    # Experts stored transposed with gate/up columns alternating, expert and router biases, attention sinks,
    # q/k/v/o biases, and engine names of vLLM's own (attn, embedding).
    "gpt_oss": {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_local_experts": 4,
                "num_experts_per_tok": 2, "attention_bias": True, **_SLIDING},
    # Multi-head latent attention + MoE: layer 0 dense (first_k_dense_replace), layer 1 routed + shared experts and
    # a score-corrected router. The latent dims are DeepSeek's own (kv_lora_rank 512 + rope 64 = 576, the one
    # head size vLLM's CPU MLA decode kernel is built for); per-head nope/v dims and q_lora_rank stay tiny.
    "deepseek_v3": {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 64, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 64, "v_head_dim": 32, "n_group": 1, "topk_group": 1,
                    "topk_method": "noaux_tc",
                    "head_dim": 64, "num_key_value_heads": 4},  # as transformers derives them for MLA
}
#: Families the codec refuses (see aurora_store.codec.families.REFUSED): the transformers side is checked.
REFUSED: dict[str, dict[str, Any]] = {}

#: Configurations of a family that an engine cannot address in place (see the attach tests).
VARIANTS: dict[str, dict[str, Any]] = {
    # An expert size vLLM's CPU kernels zero-pad to their 32-wide block (48 → 64) before repacking.
    "qwen3_moe_padded": {**FAMILIES["qwen3_moe"], "moe_intermediate_size": 48},
}


def config_of(family: str) -> dict[str, Any]:
    return {**BASE, **FAMILIES.get(family, REFUSED.get(family, VARIANTS.get(family, {})))}


def save_tiny(family: str, directory: Path, seed: int = 0) -> Path:
    """A tiny random ``family`` model saved with ``save_pretrained`` (+ tokenizer) in ``directory``. Every
    element is drawn afresh (norms too), so a tensor put in the wrong place cannot go unnoticed."""
    model = build_model(config_of(family), seed=seed, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    build_tokenizer().save_pretrained(str(directory))
    (directory / "family.json").write_text(json.dumps({"family": family}))
    return directory
