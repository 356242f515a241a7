"""``StepPublisher`` — the API under the trainer callback — without a trainer: state dicts in, signed versions
out, replayable bit-exactly by the ordinary reader path."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec import ModelLayout, TensorTarget, digest_state
from aurora_store.errors import ConfigError, LayoutError, SignatureError
from aurora_store.follow import follow
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshots import load_snapshot
from aurora_store.trust import Verifier, generate_keypair
from workers.integrations.hf_callback import StepPublisher
from workers.rl.model import DEFAULT_CONFIG, build_model


def _states(steps: int):
    """The fp32 policy of a few fake optimizer steps (a different 0.5 % of elements each step)."""
    model = build_model(DEFAULT_CONFIG, seed=0)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    out = [{n: t.clone() for n, t in state.items()}]
    for _ in range(steps):
        for t in state.values():
            mask = torch.rand(t.shape, generator=gen) < 0.005
            t[mask] += 0.05
        out.append({n: t.clone() for n, t in state.items()})
    return out


def test_publish_step_versions_replay_bit_exactly(tmp_path):
    private, public = generate_keypair()
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    states = _states(4)
    pub = StepPublisher(str(tmp_path / "b"), layout, run="r", signing_key=private, snapshot_every=2)
    pub.start(states[0])
    for step in range(1, 5):
        outcome = pub.publish_step(states[step], step)
        bf16 = {n: t.to(torch.bfloat16) for n, t in states[step].items() if n in layout.train_names}
        assert outcome.digest == digest_state(layout, bf16)
    store = DeltaStore(open_bucket(str(tmp_path / "b")))
    assert store.versions() == [1, 2, 3, 4] and store.snapshot_versions() == [0, 2, 4]
    assert store.run_info()["run"] == "r"
    verify = Verifier.load(public)
    state, _ = load_snapshot(store, 0, layout, verify_manifest=verify)
    target = TensorTarget.from_state(layout, state, version=0)
    follow(store, target, 4, snapshots=False, verify=verify)
    assert target.full_digest() == outcome.digest
    with pytest.raises(SignatureError):
        Verifier.load(generate_keypair()[1])(store.manifest(1))


def test_bad_calls_are_refused_and_leave_the_bucket_alone(tmp_path):
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    states = _states(2)
    pub = StepPublisher(str(tmp_path / "b"), layout)
    with pytest.raises(ConfigError, match="start"):
        pub.publish_step(states[1], 1)
    pub.start(states[0])
    with pytest.raises(ConfigError, match="consecutive"):
        pub.publish_step(states[1], 2)
    with pytest.raises(LayoutError, match="lacks"):
        pub.publish_step({"model.embed_tokens.weight": states[1]["model.embed_tokens.weight"]}, 1)
    with pytest.raises(ConfigError, match=r"nn\.Module or a state dict"):
        pub.publish_step([1, 2], 1)
    assert pub.store.versions() == []
    pub.publish_step(states[1], 1)
    # A second run into the same bucket would interleave versions: refused before anything is written.
    with pytest.raises(ConfigError, match="fresh bucket"):
        StepPublisher(str(tmp_path / "b"), layout).start(states[0])
    assert pub.store.versions() == [1]
