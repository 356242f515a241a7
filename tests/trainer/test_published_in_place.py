"""Publishing keeps one bf16 copy of the policy: the delta is encoded from casts made tensor by tensor, and the
published rows are then overwritten in place — same storage, exactly the master's cast, the digest the
manifest records, and a delta that an actor applies to reach those rows bit for bit."""

from __future__ import annotations

import uuid

import torch

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget
from aurora_store.codec.sharding import rows_digest
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.follow import follow
from aurora_store.store import DeltaStore
from aurora_store.store.publisher import VersionPublisher
from workers.publish.delta import RankPublisher
from workers.publish.ranks import Ranks
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.trainer.policy import ShardedPolicy


def test_publish_updates_the_published_rows_in_place():
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    model = build_model(DEFAULT_CONFIG, seed=0)
    policy = ShardedPolicy.shard(model, layout, Ranks())
    policy.published = policy.cast_rows()
    before = {n: r.tensor.clone() for n, r in policy.published.items()}
    pointers = {n: r.tensor.data_ptr() for n, r in policy.published.items()}
    base = rows_digest(layout, policy.published)
    with torch.no_grad():  # an optimizer step's worth of change
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 1e-2)
    lazy = policy.cast_rows_lazily()
    assert set(lazy) == set(layout.train_names) and len(lazy) == len(layout.train_names)
    store = DeltaStore(f"memory://{uuid.uuid4().hex}", create=True)
    publisher = RankPublisher(Ranks(), VersionPublisher(store, layout, CodecParams(segment_bytes=4096), streams=2))
    outcome = publisher.publish(1, 0, base, policy.published, lazy)
    policy.refresh_published()
    assert {n: r.tensor.data_ptr() for n, r in policy.published.items()} == pointers  # no second copy kept
    expected = policy.cast_rows()
    for name, rows in policy.published.items():
        assert torch.equal(rows.tensor.view(torch.int16), expected[name].tensor.view(torch.int16)), name
    assert any(not torch.equal(before[n], r.tensor) for n, r in policy.published.items())
    assert outcome.digest == rows_digest(layout, policy.published) == \
        WeightsDigest.parse(store.manifest(1).weights_digest)
    actor = {n: t.clone() for n, t in before.items()}  # an actor on version 0 follows the delta (in place)
    target = TensorTarget.from_state(layout, actor, version=0)
    follow(store, target, 1, snapshots=False)
    assert target.digest == outcome.digest
    for name, rows in policy.published.items():
        assert torch.equal(actor[name].view(torch.int16), rows.tensor.view(torch.int16)), name
