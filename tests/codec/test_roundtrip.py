"""Bit-exact reconstruction, property-tested over shapes, bit patterns and chains of versions."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aurora_store.codec import (
    CodecParams,
    DeltaManifest,
    ModelLayout,
    TensorTarget,
    WeightTarget,
    apply_delta,
    digest_state,
)
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import UnsupportedDtypeError
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for
from benchmarks.synthetic import QWEN3_BENCH_CONFIG, AdamSimulator

SPECIAL_BITS = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x0001, 0x8001, 0x7F7F]  # ±0, ±inf, NaNs…


def assert_same_bits(target: WeightTarget, layout: ModelLayout, state) -> None:
    expected = TensorTarget.from_state(layout, state)
    for tensor in layout.tensors:
        assert torch.equal(target.fused_bits(tensor.name), expected.fused_bits(tensor.name)), tensor.name


def test_chain_of_25_versions_is_bit_exact_and_digests_match_from_scratch():
    layout = ModelLayout.from_config(TINY_QWEN3)
    states = [random_state(layout, seed=1)]
    for step in range(25):
        states.append(perturb(states[-1], fraction=0.03, seed=100 + step))
    actor = target_for(layout, states[0], version=0)
    digest = actor.digest
    assert digest == digest_state(layout, states[0])
    for version in range(1, len(states)):
        manifest, segments = encode(layout, states[version - 1], states[version], version, version - 1, digest)
        manifest = DeltaManifest.from_bytes(manifest.to_bytes())
        apply_delta(manifest, blobs(segments), actor)
        digest = WeightsDigest.parse(manifest.weights_digest)
        assert actor.version == version
        assert actor.digest == digest == digest_state(layout, states[version]) == actor.full_digest()
        assert_same_bits(actor, layout, states[version])


@st.composite
def state_pairs(draw):
    n_tensors = draw(st.integers(1, 4))
    old, new = {}, {}
    for i in range(n_tensors):
        shape = tuple(draw(st.lists(st.integers(1, 24), min_size=1, max_size=3)))
        pool = st.one_of(st.sampled_from(SPECIAL_BITS), st.integers(0, 0xFFFF))
        base = draw(hnp.arrays(np.uint16, shape, elements=pool)).reshape(-1)
        mode = draw(st.sampled_from(["none", "all", "some", "ulp"]))
        if mode == "none":
            changed = base.copy()
        elif mode == "all":
            changed = base ^ np.uint16(draw(st.integers(1, 0xFFFF)))
        else:
            mask = draw(hnp.arrays(np.bool_, base.size))
            delta = np.where(mask, 1 if mode == "ulp" else draw(st.integers(1, 0xFFFF)), 0).astype(np.uint16)
            changed = base + delta
        old[f"t{i}"] = torch.from_numpy(base.view(np.int16).reshape(shape).copy()).view(torch.bfloat16)
        new[f"t{i}"] = torch.from_numpy(changed.view(np.int16).reshape(shape).copy()).view(torch.bfloat16)
    return old, new


@given(state_pairs(), st.sampled_from(["delta16", "raw"]), st.sampled_from(["zstd", "none"]),
       st.sampled_from([4096, 8192]))
def test_any_pair_of_states_roundtrips_bit_exactly(pair, values, entropy, segment_bytes):
    old, new = pair
    layout = ModelLayout.identity(old)
    params = CodecParams(segment_bytes=segment_bytes, values=values, entropy=entropy)
    target = target_for(layout, old, version=3)
    manifest, segments = encode(layout, old, new, 4, 3, target.digest, params)
    changed = sum(int((old[k].view(torch.int16) != new[k].view(torch.int16)).sum()) for k in old)
    assert manifest.changed_total == changed
    if changed == 0:
        assert segments == []
    apply_delta(manifest, blobs(segments), target)
    assert_same_bits(target, layout, new)
    assert target.digest == target.full_digest() == digest_state(layout, new)


def test_a_tensor_larger_than_a_segment_is_split_by_element_range():
    layout = ModelLayout.identity({"big": torch.zeros(300_000, dtype=torch.bfloat16)})
    old = {"big": torch.zeros(300_000, dtype=torch.bfloat16)}
    new = {"big": torch.randn(300_000).to(torch.bfloat16)}  # everything changes
    params = CodecParams(segment_bytes=64 * 1024)
    target = target_for(layout, old, version=0)
    manifest, segments = encode(layout, old, new, 1, 0, target.digest, params)
    assert len(segments) > 5
    ranges = [(c.lo, c.hi) for s in manifest.segments for c in s.chunks]
    assert ranges[0][0] == 0 and ranges[-1][1] == 300_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), "chunks tile the tensor in order"
    assert max(s.size for s in manifest.segments) < 2 * params.segment_bytes
    # segments may arrive in any order (parallel download)
    apply_delta(manifest, [(s.ref, s.data) for s in reversed(segments)], target)
    assert_same_bits(target, layout, new)


def test_segments_are_content_addressed_and_deterministic():
    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, 1)
    new = perturb(old, 0.05, 2)
    digest = digest_state(layout, old)
    m1, s1 = encode(layout, old, new, 1, 0, digest)
    m2, s2 = encode(layout, old, new, 1, 0, digest)
    assert [s.data for s in s1] == [s.data for s in s2]
    assert m1.to_bytes() == m2.to_bytes()


def test_adam_step_deltas_cost_under_one_and_a_half_bytes_per_change():
    config = dict(QWEN3_BENCH_CONFIG, hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  intermediate_size=1536, num_hidden_layers=2, vocab_size=4096)
    layout = ModelLayout.from_config(config)
    sim = AdamSimulator(layout, lr=1e-6, seed=3)
    for _ in range(4):
        sim.step()
    old = sim.published()
    sim.step()
    new = sim.published()
    manifest, _ = encode(layout, old, new, 1, 0, digest_state(layout, old), CodecParams())
    assert 0.005 < manifest.density < 0.05
    assert (manifest.segment_bytes + len(manifest.to_bytes())) / manifest.changed_total < 1.5


def test_non_16_bit_tensors_are_rejected_with_a_type_error():
    layout = ModelLayout.identity({"w": torch.zeros(4, dtype=torch.bfloat16)})
    with pytest.raises(UnsupportedDtypeError):
        encode(layout, {"w": torch.zeros(4)}, {"w": torch.ones(4)}, 1, 0, WeightsDigest())


def test_fp16_tensors_work_too():
    old = {"w": torch.randn(100).half()}
    new = {"w": old["w"] * 1.5}
    layout = ModelLayout.identity(old)
    target = target_for(layout, old, version=0)
    manifest, segments = encode(layout, old, new, 1, 0, target.digest)
    apply_delta(manifest, blobs(segments), target)
    assert_same_bits(target, layout, new)


@pytest.mark.parametrize("extraction", ["host", "device"])
def test_blockwise_change_search_gives_the_same_delta(monkeypatch, extraction):
    # Large pieces are compared block by block (bounded mask) on the host and with the device ops alike; the
    # result must not depend on the block size, including changes that sit on block boundaries.
    from aurora_store.codec import extract as extract_module

    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=3)
    new = perturb(old, fraction=0.03, seed=4)
    embed = new["model.embed_tokens.weight"].view(-1)
    for i in (0, 63, 64, 127, 128, embed.numel() - 1):  # boundaries of 64-element blocks
        embed[i] = embed[i] + 1.0
    whole, whole_segments = encode(layout, old, new, 1, 0, WeightsDigest())  # host, no piece over a block
    monkeypatch.setattr(extract_module, "MASK_BLOCK", 64)
    blocked, blocked_segments = encode(layout, old, new, 1, 0, WeightsDigest(), extraction=extraction)
    assert [s.data for s in blocked_segments] == [s.data for s in whole_segments]
    assert blocked.weights_digest == whole.weights_digest and blocked.changed == whole.changed


def test_staging_plans_the_scatter_for_its_target_and_another_target_still_lands_exactly():
    # Staging cuts each tensor's indices at the target's q/k/v and gate/up pieces (the plan), so activation
    # is one scatter_ per piece; a twin target (same bits, another object) cannot use that plan and scatters.
    from aurora_store.codec.decoder import activate, stage

    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=3)
    new = perturb(old, fraction=0.05, seed=4)
    staged_on, twin = target_for(layout, old, version=0), target_for(layout, old, version=0)
    manifest, segments = encode(layout, old, new, 1, 0, staged_on.digest)
    staged = stage(manifest, blobs(segments), staged_on)
    assert all(u.plan is not None and u.plan.owner is staged_on for u in staged.updates)
    assert any(len(u.plan.parts) > 1 for u in staged.updates)  # fused q/k/v or gate/up, cut at its pieces
    for target in (staged_on, twin):
        activate(staged, target)
        assert target.version == 1 and target.full_digest() == target.digest
        assert_same_bits(target, layout, new)
