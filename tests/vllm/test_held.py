"""Staging a version inside each worker (``workers.vllm.held``) without vLLM: every TP rank decodes a real
published delta into its own slice of parameters partitioned the way vLLM partitions them (and MoE experts
repacked by a blocked packing), the ranks' digest shares and owned counts add up to the manifest, and writing
the held slices gives each rank exactly its slice of the new weights. Needs no vLLM."""

from __future__ import annotations

import time

import pytest
import torch

from aurora_store.codec import ModelLayout, digest_state
from aurora_store.codec.layout import bits_view
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import BaseVersionMismatchError, CorruptSegmentError, MessageError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.testing.builders import perturb, publish, random_state
from tests.vllm.test_shards import CONFIG, _blocked, rank_part
from workers.vllm.held import HeldStager, StageRequest, stage_slice, write_slice
from workers.vllm.shards import bind_layout, permuted, slab_permutation
from workers.vllm.worker import flat_bits

pytestmark = pytest.mark.vllm

MOE = {**CONFIG, "model_type": "qwen3_moe", "num_experts": 3, "moe_intermediate_size": 8}
PADDED_VOCAB = 128


def _published(tmp_path, config):
    layout = ModelLayout.from_config(config)
    old = random_state(layout, seed=1)
    new = perturb(old, 0.05, seed=2)
    store = DeltaStore(open_bucket(str(tmp_path / "bucket"), create=True))
    publish(store, layout, old, new, 1, digest_state(layout, old))
    manifest = store.manifest(1)
    segments = [(ref, store.get_segment(ref)) for ref in manifest.segments]
    return layout, old, new, store, manifest, segments


def _rank(layout: ModelLayout, state, rank: int, tp: int):
    """Rank ``rank``'s parameters (vLLM's partitioning; experts packed) and shards bound to them."""
    params = {}
    for tensor in layout.tensors:
        full = layout.fuse(state)[tensor.name]
        part = rank_part(tensor, full, rank, tp, PADDED_VOCAB).contiguous()
        params[tensor.name] = _blocked(part) if ".experts." in tensor.name else part
    shards, problems = bind_layout(layout, params, rank, tp)
    assert not problems, problems
    for name in shards:
        if ".experts." in name:
            rows, cols = layout[name].shape[1:]
            shards[name] = permuted(shards[name], slab_permutation(_blocked, (rows, cols)))
    return params, shards


def _flats(layout, params, shards):
    return lambda name: flat_bits(params, name, shards[layout[name].name])


@pytest.mark.parametrize(("config", "tp"), [(CONFIG, 1), (CONFIG, 2), (MOE, 1)], ids=["tp1", "tp2", "moe-packed"])
def test_every_rank_stages_and_writes_exactly_its_slice(tmp_path, config, tp):
    layout, old, new, _, manifest, segments = _published(tmp_path, config)
    owned, moved = 0, ZERO
    ranks = []
    for rank in range(tp):
        params, shards = _rank(layout, old, rank, tp)
        held = stage_slice(layout, shards, _flats(layout, params, shards), manifest, segments)
        assert all(local.dtype == torch.int32 and bits.dtype == torch.int16 for _, local, bits in held.writes)
        owned, moved = owned + held.owned, moved + held.share
        ranks.append((params, shards, held))
    assert owned == manifest.changed_total
    assert str(WeightsDigest.parse(manifest.base_weights_digest) + moved) == manifest.weights_digest
    for rank, (params, shards, held) in enumerate(ranks):
        written, seconds = write_slice(_flats(layout, params, shards), held)
        assert written == held.held and seconds >= 0
        expected, _ = _rank(layout, new, rank, tp)
        for name, param in params.items():
            assert torch.equal(bits_view(param), bits_view(expected[name])), (rank, name)


def test_a_corrupt_segment_is_refused_before_anything_is_held(tmp_path):
    layout, old, _, _, manifest, segments = _published(tmp_path, CONFIG)
    params, shards = _rank(layout, old, 0, 1)
    ref, data = segments[0]
    bad = [(ref, data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]), *segments[1:]]
    with pytest.raises(CorruptSegmentError):
        stage_slice(layout, shards, _flats(layout, params, shards), manifest, bad)
    with pytest.raises(CorruptSegmentError, match="missing"):
        stage_slice(layout, shards, _flats(layout, params, shards), manifest, segments[1:])


def _wait(stager: HeldStager, version: int) -> list:
    deadline = time.monotonic() + 60
    while (summary := stager.poll(version)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return summary


def test_the_stager_reads_the_bucket_itself_and_drops_what_a_write_made_stale(tmp_path):
    layout, old, new, store, manifest, _ = _published(tmp_path, CONFIG)
    params, shards = _rank(layout, old, 0, 1)
    stager = HeldStager()
    request = StageRequest.from_wire(StageRequest(manifest, store.url).to_wire())
    stager.start(request, layout, shards, _flats(layout, params, shards))
    version, held, owned, share, _ = _wait(stager, 1)
    assert (version, owned) == (1, manifest.changed_total) and held == owned
    assert str(WeightsDigest.parse(manifest.base_weights_digest) + WeightsDigest.parse(share)) \
        == manifest.weights_digest
    with pytest.raises(BaseVersionMismatchError):
        stager.take(1, 7)  # not staged on that base
    stager.wrote()  # any other write to the weights: what was staged on them is gone
    with pytest.raises(BaseVersionMismatchError):
        stager.poll(1)
    with pytest.raises(BaseVersionMismatchError):
        stager.take(1, 0)
    # Staged again, it is taken once and writes the new weights.
    stager.start(request, layout, shards, _flats(layout, params, shards))
    _wait(stager, 1)
    write_slice(_flats(layout, params, shards), stager.take(1, 0))
    with pytest.raises(BaseVersionMismatchError):
        stager.take(1, 0)
    expected, _ = _rank(layout, new, 0, 1)
    assert all(torch.equal(bits_view(p), bits_view(expected[n])) for n, p in params.items())
    stager.close()


@pytest.mark.parametrize("wire", [None, [b"{}"], ["not bytes", "file:///x", None], [b"", 3, None],
                                  [b"", "file:///x", ["only a url"]]])
def test_malformed_stage_requests_are_refused(wire):
    with pytest.raises(MessageError):
        StageRequest.from_wire(wire)
