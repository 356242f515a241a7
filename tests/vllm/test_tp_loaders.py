"""Tensor parallelism > 1: the per-rank index mapping of :func:`shard_for` checked against vLLM's *own*
weight loaders (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding /
ParallelLMHead), built for each TP rank on the CPU with vLLM's TP rank and size patched in. Every element
of the full (training-layout) weights carries its global fused flat index as its value, so after vLLM's
loader has filled a rank's parameter, the element at each local index ``shard_for`` names must be exactly
the global element asked for, and every element must be held by one owner rank. (The vLLM CPU build here
cannot start a TP = 2 engine in bounded time on two shared cores; this is the check that runs instead.)"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from aurora_store.codec import ModelLayout
from workers.vllm.shards import shard_for

pytestmark = pytest.mark.vllm

CONFIG = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "intermediate_size": 96, "num_hidden_layers": 1, "vocab_size": 100,
          "tie_word_embeddings": False}


@contextlib.contextmanager
def tp_rank(rank: int, size: int):
    """vLLM's layer constructors read the TP rank and size from its process group: answer for ``rank``."""
    linear = pytest.importorskip("vllm.model_executor.layers.linear")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor import parameter
    from vllm.model_executor.layers import vocab_parallel_embedding

    with contextlib.ExitStack() as stack:
        for module in (linear, parameter, vocab_parallel_embedding):
            for fn, value in (("get_tensor_model_parallel_rank", rank), ("get_tensor_model_parallel_world_size", size)):
                if hasattr(module, fn):
                    stack.enter_context(mock.patch.object(module, fn, lambda v=value: v))
        stack.enter_context(set_current_vllm_config(VllmConfig()))
        yield linear, vocab_parallel_embedding


def load_rank(c: dict, layout: ModelLayout, full: dict[str, torch.Tensor], rank: int,
              size: int) -> dict[str, torch.Tensor]:
    """Each fused inference tensor as vLLM's loaders place it on ``rank`` (fp32: indices stay exact)."""
    h, heads, kv, hd, inter, vocab = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                                      c["head_dim"], c["intermediate_size"], c["vocab_size"])
    f32 = {"params_dtype": torch.float32}
    with tp_rank(rank, size) as (linear, emb):
        layers = {
            "model.layers.0.self_attn.qkv_proj.weight": (linear.QKVParallelLinear(h, hd, heads, kv, bias=False, **f32),
                                                         ["q", "k", "v"]),
            "model.layers.0.mlp.gate_up_proj.weight": (linear.MergedColumnParallelLinear(h, [inter, inter], bias=False,
                                                                                         **f32), [0, 1]),
            "model.layers.0.self_attn.o_proj.weight": (linear.RowParallelLinear(heads * hd, h, bias=False, **f32),
                                                       [None]),
            "model.layers.0.mlp.down_proj.weight": (linear.RowParallelLinear(inter, h, bias=False, **f32), [None]),
            "model.embed_tokens.weight": (emb.VocabParallelEmbedding(vocab, h, **f32), [None]),
            "lm_head.weight": (emb.ParallelLMHead(vocab, h, **f32), [None]),
        }
        out = {}
        for name, (layer, shard_ids) in layers.items():
            tensor = layout[name]
            param = layer.weight
            for comp, shard_id in zip(tensor.components, shard_ids):
                part = full[name][comp.row_offset: comp.row_offset + comp.rows]
                if shard_id is None:
                    param.weight_loader(param, part)
                else:
                    param.weight_loader(param, part, shard_id)
            out[name] = param.data
    return out


@pytest.mark.parametrize("size", [2, 4])
def test_shard_for_matches_vllms_weight_loaders_on_every_rank(size):
    config = dict(CONFIG, num_key_value_heads=max(CONFIG["num_key_value_heads"], size))  # no replicated KV heads
    layout = ModelLayout.from_config(config)
    names = ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
             "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.embed_tokens.weight", "lm_head.weight"]
    full = {n: torch.arange(layout[n].numel, dtype=torch.float32).reshape(layout[n].shape) for n in names}
    owned = {n: torch.zeros(layout[n].numel, dtype=torch.int64) for n in names}
    for rank in range(size):
        local = load_rank(config, layout, full, rank, size)
        for name in names:
            tensor, param = layout[name], local[name]
            shard = shard_for(tensor, tuple(param.shape), rank, size)
            assert not shard.full, name
            everything = torch.arange(tensor.numel, dtype=torch.int64)
            positions, local_idx = shard.select(everything)
            held = param.flatten()[local_idx].to(torch.int64)
            assert torch.equal(held, everything[positions]), (name, rank)
            glob = shard.global_indices()
            assert torch.equal(param.flatten()[: glob.numel()].to(torch.int64), glob), (name, rank)
            if shard.owner:
                owned[name][positions] += 1
    for name in names:
        assert torch.equal(owned[name], torch.ones_like(owned[name])), name
