"""Sharded extraction without processes: ranks simulated in one process over the same bucket.

Rows owned by each rank map to disjoint flat ranges of the fused tensors; the ranks' parts merge into a
manifest that decoders accept and that reproduces the new weights exactly; with one rank everything is
byte-identical to the unsharded publisher, snapshot writer and learner.
"""

from __future__ import annotations

import copy
import itertools
import uuid

import pytest
import torch

from aurora_store.codec import CodecParams, DeltaManifest, ModelLayout, TensorTarget, digest_state, stage
from aurora_store.codec.decoder import activate
from aurora_store.codec.digest import ZERO
from aurora_store.codec.sharding import DeltaPart, even_rows, merge_parts, rank_rows, row_pieces, rows_digest
from aurora_store.errors import LayoutError
from aurora_store.store import DeltaStore
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import write_snapshot
from workers.publish.delta import RankPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import owners, plan_files, write_sharded_snapshot

CONFIG = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 37,
          "tie_word_embeddings": True}


def states(layout: ModelLayout, seed: int = 0, density: float = 0.05):
    gen = torch.Generator().manual_seed(seed)
    old, new = {}, {}
    for tensor in layout.tensors:
        for comp in tensor.components:
            shape = tensor.component_shape(comp)
            a = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            bits = a.view(torch.int16).clone()
            mask = torch.rand(shape, generator=gen) < density
            bits[mask] += 1
            old[comp.train_name], new[comp.train_name] = a, bits.view(torch.bfloat16)
    return old, new


def store() -> DeltaStore:
    return DeltaStore(f"memory://{uuid.uuid4().hex}", create=True)


@pytest.mark.parametrize("rows", [1, 7, 16, 33, 384])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_even_rows_split_like_torch_chunk(rows, world):
    sizes = [c.shape[0] for c in torch.arange(rows).chunk(world)]
    sizes += [0] * (world - len(sizes))
    spans = [even_rows(rows, r, world) for r in range(world)]
    assert [b - a for a, b in spans] == sizes
    assert spans[0][0] == 0 and all(a == prev[1] for prev, (a, _) in itertools.pairwise(spans))


#: gpt-oss's expert tensors are stored transposed against the engine's: each rank puts its own rows (experts) in
#: engine order; 3 experts over 2 ranks is an uneven split.
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 48, "num_hidden_layers": 2, "vocab_size": 37,
           "num_local_experts": 3, "attention_bias": True}


@pytest.mark.parametrize("config", [CONFIG, GPT_OSS], ids=["qwen3", "gpt_oss"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_parts_merge_into_a_delta_that_reproduces_the_new_weights(world, config):
    layout = ModelLayout.from_config(config)
    old, new = states(layout)
    bucket = store()
    publisher = VersionPublisher(bucket, layout, CodecParams(segment_bytes=4096), streams=2)
    parts = []
    for rank in range(world):
        part, _ = publisher.upload_part(row_pieces(layout, rank_rows(layout, old, rank, world),
                                                   rank_rows(layout, new, rank, world)))
        parts.append(DeltaPart.from_json(part.to_json()))  # what crosses ranks: JSON
    base = digest_state(layout, old)
    assert sum((rows_digest(layout, rank_rows(layout, old, r, world)) for r in range(world)), ZERO) == base
    report = publisher.publish_parts(1, 0, base, parts)
    manifest = DeltaManifest.from_bytes(bucket.manifest_bytes(1))
    assert manifest.segments == tuple(s for p in parts for s in p.segments)
    assert manifest.weights_digest == str(digest_state(layout, new)) == report.manifest.weights_digest
    target = TensorTarget.from_state(layout, {k: v.clone() for k, v in old.items()}, version=0)
    activate(stage(manifest, [(ref, bucket.get_segment(ref)) for ref in manifest.segments], target), target)
    fused = layout.fuse(new)
    for name in layout.names:
        assert torch.equal(target.fused_bits(name), fused[name].reshape(-1).view(torch.int16))


def test_parts_that_overlap_or_leave_gaps_are_rejected():
    layout = ModelLayout.from_config(CONFIG)
    old, new = states(layout)
    publisher = VersionPublisher(store(), layout, CodecParams(segment_bytes=4096), streams=1)
    parts = [publisher.upload_part(row_pieces(layout, rank_rows(layout, old, r, 2), rank_rows(layout, new, r, 2)))[0]
             for r in range(2)]
    with pytest.raises(LayoutError, match=r"gap|cover"):
        merge_parts(layout, parts[:1])
    with pytest.raises(LayoutError, match="overlap"):
        merge_parts(layout, [parts[0], parts[0], parts[1]])
    with pytest.raises(LayoutError):
        list(row_pieces(layout, rank_rows(layout, old, 0, 2), rank_rows(layout, new, 1, 2)))


def test_one_rank_publishes_exactly_what_the_unsharded_publisher_does():
    layout = ModelLayout.from_config(CONFIG)
    old, new = states(layout)
    base = digest_state(layout, old)
    a, b = store(), store()
    from aurora_store.codec import pieces_from_states

    plain = VersionPublisher(a, layout, CodecParams(segment_bytes=4096), streams=2).publish(
        1, 0, base, pieces_from_states(layout, old, new))
    announced = []
    ranked = RankPublisher(Ranks(), VersionPublisher(b, layout, CodecParams(segment_bytes=4096), streams=2),
                           announce=announced.append).publish(1, 0, base, rank_rows(layout, old, 0, 1),
                                                              rank_rows(layout, new, 0, 1))
    assert ranked.report.manifest.segments == plain.manifest.segments
    assert ranked.report.manifest.changed == plain.manifest.changed
    assert str(ranked.digest) == plain.manifest.weights_digest
    assert sorted(r.digest for r in announced) == sorted(s.digest for s in plain.manifest.segments)


@pytest.mark.parametrize("shard_bytes", [1 << 30, 20_000])
def test_one_rank_snapshot_is_byte_identical_to_the_unsharded_one(shard_bytes):
    layout = ModelLayout.from_config(CONFIG)
    _, new = states(layout)
    digest = digest_state(layout, new)
    a, b = store(), store()
    write_snapshot(a, 3, new, layout, digest, extra_files={"config.json": b"{}"}, shard_bytes=shard_bytes)
    write_sharded_snapshot(Ranks(), b, 3, layout, rank_rows(layout, new, 0, 1), digest,
                           extra_files={"config.json": b"{}"}, shard_bytes=shard_bytes)
    ma, mb = read_snapshot_manifest(a, 3), read_snapshot_manifest(b, 3)
    assert ma.files == mb.files and ma.weight_files == mb.weight_files
    assert (len(ma.weight_files) > 1) == (shard_bytes < 1 << 30)


def test_snapshot_owners_cover_every_tensor_once_and_balance_bytes():
    layout = ModelLayout.from_config(CONFIG)
    plan = plan_files(layout, 2)
    named = [n for f in plan for n in f.tensors]
    assert sorted(named) == sorted(layout.train_names)
    assert [f.owner for f in plan] == [0, 1]
    owner = owners(layout, 2)
    load = [sum(2 * t.row_size * c.rows for t in layout.tensors for c in t.components if owner[c.train_name] == r)
            for r in range(2)]
    assert max(load) - min(load) <= max(2 * t.numel for t in layout.tensors)


@pytest.mark.slow  # builds a transformers model
def test_one_rank_learner_steps_exactly_like_the_grpo_learner():
    from workers.rl.grpo import GRPOConfig, GRPOLearner, Sample
    from workers.rl.model import DEFAULT_CONFIG, build_model
    from workers.trainer.learner import ShardedLearner

    model = build_model(dict(DEFAULT_CONFIG), seed=0)
    twin = copy.deepcopy(model)
    samples = [Sample((5, 6, 7), (8, 9), (-2.0, -3.0), float(i % 2), f"g{i // 2}") for i in range(6)]
    config = GRPOConfig(lr=1e-3, epochs=2)
    a = GRPOLearner(model, config).step(samples)
    b = ShardedLearner(twin, config, Ranks()).step(samples)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name
    assert b.grad_norm == a.grad_norm and b.tokens == a.tokens
    # Same process, same kernels, bit-identical weights: only the sharded learner's float64 token-weighting
    # (loss · T / T) separates the two numbers — far below 1e-6 relative on any CPU.
    assert b.loss == pytest.approx(a.loss, rel=1e-6)
