"""The global-flat-index → (rank, local index) maths for tensor-parallel shards (enabled only at TP=1 so far),
checked against vLLM's documented partitioning built with plain tensor slicing. Needs no vLLM."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec import ModelLayout
from aurora_store.errors import LayoutError
from workers.vllm.shards import Shard, permuted, shard_for, slab_permutation
from workers.vllm.wire import merge_gathered, pack_indices, unpack_indices

pytestmark = pytest.mark.vllm

CONFIG = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
          "head_dim": 16, "intermediate_size": 96, "num_hidden_layers": 1, "vocab_size": 100,
          "tie_word_embeddings": True}


def rank_part(tensor, full: torch.Tensor, rank: int, tp: int, padded_vocab: int) -> torch.Tensor:
    """What rank ``rank`` holds, built the way vLLM partitions (per component rows / columns / vocab)."""
    leaf = tensor.name.split(".")[-2]
    if leaf in ("qkv_proj", "gate_up_proj"):
        return torch.cat([full[c.row_offset: c.row_offset + c.rows].chunk(tp)[rank] for c in tensor.components])
    if leaf in ("o_proj", "down_proj"):
        return full.chunk(tp, dim=1)[rank]
    if leaf == "embed_tokens":
        padded = torch.zeros(padded_vocab, *full.shape[1:], dtype=full.dtype)
        padded[: full.shape[0]] = full
        return padded.chunk(tp)[rank]
    return full


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_global_index_lands_on_the_rank_and_offset_that_hold_it(tp):
    layout = ModelLayout.from_config(CONFIG)
    padded_vocab = 128
    for tensor in layout.tensors:
        full = torch.arange(tensor.numel, dtype=torch.int64).reshape(tensor.shape)  # value = global index
        indices = torch.arange(tensor.numel, dtype=torch.int64)
        found = torch.zeros(tensor.numel, dtype=torch.int64)
        for rank in range(tp):
            local = rank_part(tensor, full, rank, tp, padded_vocab)
            shard = shard_for(tensor, tuple(local.shape), rank, tp)
            positions, local_idx = shard.select(indices)
            positions = indices if positions is None else positions
            # The local element at local_idx is exactly the global element asked for.
            assert torch.equal(local.flatten()[local_idx], indices[positions]), (tensor.name, rank)
            if shard.owner:
                found[positions] += 1
                glob = shard.global_indices()
                assert torch.equal(local.flatten()[: glob.numel()], glob), (tensor.name, rank)
        assert torch.equal(found, torch.ones_like(found)), tensor.name  # each element owned exactly once


def test_tp1_shard_is_the_whole_tensor_and_ignores_vocabulary_padding():
    layout = ModelLayout.from_config(CONFIG)
    embed = layout["model.embed_tokens.weight"]
    shard = shard_for(embed, (128, 64), 0, 1)
    assert isinstance(shard, Shard) and shard.full and shard.numel == embed.numel
    with pytest.raises(LayoutError):
        shard_for(layout["model.layers.0.self_attn.qkv_proj.weight"], (0,), 0, 1)


def test_wire_helpers_round_trip():
    small = torch.tensor([0, 5, 2**31 - 1])
    big = torch.tensor([0, 2**33])
    assert pack_indices(small)[0] == "i4" and pack_indices(big)[0] == "i8"
    for idx in (small, big):
        assert torch.equal(unpack_indices(*pack_indices(idx)), idx)
    bits = torch.tensor([1, -2, 3], dtype=torch.int16)
    replies = [[torch.tensor([0, 2]).numpy().tobytes(), bits[[0, 2]].numpy().tobytes()],
               [torch.tensor([1]).numpy().tobytes(), bits[[1]].numpy().tobytes()]]
    assert torch.equal(merge_gathered(3, replies), bits)


def _blocked(weight: torch.Tensor) -> torch.Tensor:
    """A VNNI-like blocked packing (pairs of columns interleaved over blocks of 4 rows), like the CPU kernels'."""
    e, n, k = weight.shape
    return weight.reshape(e, n // 4, 4, k // 2, 2).permute(0, 1, 3, 2, 4).contiguous().reshape(e, n, k)


def test_a_packing_permutation_is_read_off_the_packing_function_and_addresses_every_element():
    moe = ModelLayout.from_config({**CONFIG, "model_type": "qwen3_moe", "num_experts": 3,
                                   "moe_intermediate_size": 8})
    tensor = moe["model.layers.0.mlp.experts.routed_experts.w13_weight"]
    rows, cols = tensor.shape[1:]
    shard = permuted(shard_for(tensor, tensor.shape, 0, 1), slab_permutation(_blocked, (rows, cols)))
    assert shard.whole and not shard.full
    weights = torch.randn(tensor.shape).to(torch.bfloat16)
    packed = _blocked(weights).reshape(-1).view(torch.int16)
    loader = weights.reshape(-1).view(torch.int16)
    positions, local = shard.select(torch.arange(tensor.numel))
    assert positions is None and torch.equal(packed[local], loader)
    assert torch.equal(torch.cat([shard.loader_order(packed, e) for e in range(3)]), loader)


@pytest.mark.parametrize(("pack", "expect"), [
    (lambda w: w + 0.5, "changes values"),  # arithmetic, not a reordering
    (lambda w: w.flip(0), "one permutation per expert"),  # experts swapped
    (lambda w: w[..., :-1], "packs"),  # a different shape
])
def test_a_packing_that_is_not_a_per_expert_permutation_is_refused(pack, expect):
    with pytest.raises(LayoutError, match=expect):
        slab_permutation(pack, (8, 4))
