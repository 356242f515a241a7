"""Decode-ahead on the actor's side, with a real bucket and the real prefetcher: prefetched segments of the
version after the active one are decoded before the manifest exists, staging then only checks them (same bits
as staging after the manifest), a lying manifest is still refused, and an activation discards what was
decoded against the old weights and frees its share of the byte budget."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from aurora_store.codec import CodecParams, ModelLayout, activate, digest_state, pieces_from_states, stage
from aurora_store.errors import AuroraError, DigestMismatchError, ManifestError
from aurora_store.follow import DecodeAhead, Prefetcher
from aurora_store.follow.stage import stage_version
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for
from tests.follow.helpers import staging_fetcher

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
PARAMS = CodecParams(segment_bytes=4096)


@dataclasses.dataclass
class Run:
    store: DeltaStore
    publisher: VersionPublisher
    states: list[dict]  # weights of versions 0, 1, 2

    def upload(self, version: int):
        """``version``'s segments, durable in the bucket; its manifest not written yet."""
        part, _ = self.publisher.upload_part(pieces_from_states(LAYOUT, self.states[version - 1], self.states[version]))
        assert len(part.segments) >= 3
        return part

    def publish(self, version: int, part):
        return self.publisher.publish_parts(version, version - 1, digest_state(LAYOUT, self.states[version - 1]),
                                            [part]).manifest


@pytest.fixture()
def run(tmp_path):
    store = DeltaStore(open_bucket(str(tmp_path / "bucket"), create=True))
    states = [random_state(LAYOUT, 3)]
    for seed in (4, 5):
        states.append(perturb(states[-1], 0.05, seed))
    publisher = VersionPublisher(store, LAYOUT, PARAMS, producer={"run": "t"}, record_history=False)
    return Run(store, publisher, states)


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def actor_side(run: Run, budget: int = 1 << 30):
    metrics = Metrics("actor", "t")
    prefetcher = Prefetcher(streams=2, budget_bytes=budget, metrics=metrics)
    target = target_for(LAYOUT, run.states[0], 0)
    return metrics, prefetcher, DecodeAhead(target, prefetcher, metrics, PARAMS), target


def offer_all(prefetcher: Prefetcher, run: Run, version: int, part) -> None:
    for ref in part.segments:
        assert prefetcher.offer(version, dataclasses.replace(ref, chunks=()), run.store.get_segment)


def assert_same_bits(staged, reference) -> None:
    assert [u.tensor for u in staged.updates] == [u.tensor for u in reference.updates]
    for got, want in zip(staged.updates, reference.updates):
        assert got.indices.equal(want.indices) and got.bits.equal(want.bits)


def test_segments_decoded_before_the_manifest_are_only_checked_after_it(run):
    metrics, prefetcher, ahead, target = actor_side(run)
    part = run.upload(1)
    offer_all(prefetcher, run, 1, part)
    wait_until(lambda: ahead.decoded() == len(part.segments))
    assert not run.store.versions(), "the manifest existed before the decode: nothing was tested"
    manifest = run.publish(1, part)
    kept = {ref.digest: run.store.get_segment(ref) for ref in part.segments}
    for ref in part.segments:  # staging cannot download anything
        run.store.bucket.delete(object_names.segment(ref.digest))
    staged = stage_version(run.store, 1, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                           decode=ahead.stage)
    assert ahead.last_decoded_ahead == len(part.segments) == metrics.decoded_ahead._value.get()
    assert_same_bits(staged, stage(manifest, kept, target_for(LAYOUT, run.states[0], 0)))
    assert staged.weights_digest == manifest.weights_digest
    with ahead.writing():
        activate(staged, target)
    assert target.full_digest() == digest_state(LAYOUT, run.states[1]) == target.digest
    assert ahead.decoded() == 0 and prefetcher.reserve(prefetcher.budget_bytes), "budget not given back"


def test_a_lying_manifest_is_refused_after_decode_ahead(run):
    _, prefetcher, ahead, target = actor_side(run)
    part = run.upload(1)
    offer_all(prefetcher, run, 1, part)
    wait_until(lambda: ahead.decoded() == len(part.segments))
    manifest = run.publish(1, part)
    segments = [(ref, run.store.get_segment(ref)) for ref in manifest.segments]
    first = manifest.segments[0]
    chunk = first.chunks[0]
    fewer = dataclasses.replace(chunk, count=chunk.count - 1) if chunk.count > 1 else chunk
    lies = {DigestMismatchError: [  # each a well-formed manifest; only the decoded segments can tell
        dataclasses.replace(manifest, weights_digest=str(digest_state(LAYOUT, run.states[2]))),
        consistent(manifest, manifest.segments[1:])],  # one decoded segment left out
        ManifestError: [
        consistent(manifest, (dataclasses.replace(first, size=first.size + 1), *manifest.segments[1:])),
        consistent(manifest, (dataclasses.replace(first, chunks=(fewer, *first.chunks[1:])),
                              *manifest.segments[1:]))]}
    assert fewer != chunk, "no chunk to lie about"
    for error, manifests in lies.items():
        for lie in manifests:
            for ref, data in segments:  # decoded ahead again (the prefetcher handed them over already)
                ahead.arrived(1, dataclasses.replace(ref, chunks=()), data)
            assert ahead.decoded() == len(part.segments)
            with pytest.raises(error):
                ahead.stage(lie, iter(segments))
            assert ahead.last_decoded_ahead == 0 and ahead.decoded() == 0
    assert target.version == 0 and target.full_digest() == digest_state(LAYOUT, run.states[0])
    # the truth still stages (the refused attempt dropped what it had decoded: staged normally this time)
    staged = ahead.stage(manifest, iter(segments))
    assert staged.weights_digest == manifest.weights_digest and ahead.last_decoded_ahead == 0


def consistent(manifest, segments):
    """``manifest`` listing ``segments``, with the per-tensor counts they add up to."""
    changed: dict[str, int] = {}
    for ref in segments:
        for chunk in ref.chunks:
            changed[chunk.tensor] = changed.get(chunk.tensor, 0) + chunk.count
    return dataclasses.replace(manifest, segments=tuple(segments), changed=changed)


def test_an_activation_discards_what_was_decoded_against_the_old_weights(run):
    _, prefetcher, ahead, target = actor_side(run)
    part = run.upload(1)
    offer_all(prefetcher, run, 1, part)
    wait_until(lambda: ahead.decoded() == len(part.segments))
    # Another version 1 (say, a snapshot's) is activated meanwhile: what was decoded against version 0 is gone.
    other = perturb(run.states[0], 0.05, 9)
    other_manifest, other_segments = encode(LAYOUT, run.states[0], other, 1, 0, digest_state(LAYOUT, run.states[0]),
                                            PARAMS)
    with ahead.writing():
        activate(stage(other_manifest, blobs(other_segments), target), target)
    prefetcher.retire(1)
    assert ahead.decoded() == 0 and prefetcher.reserve(prefetcher.budget_bytes), "budget not given back"
    prefetcher.release(prefetcher.budget_bytes)
    manifest = run.publish(1, part)
    with pytest.raises(AuroraError):  # made for version 0's weights: never staged on these
        stage_version(run.store, 1, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                      decode=ahead.stage)
    assert manifest.base_version == 0 and target.full_digest() == digest_state(LAYOUT, other)


def test_segments_held_for_a_later_version_are_decoded_once_it_is_next(run):
    _, prefetcher, ahead, target = actor_side(run)
    first, second = run.upload(1), run.upload(2)
    offer_all(prefetcher, run, 2, second)  # version 2 announced while the actor is on 0: only held
    wait_until(lambda: prefetcher.held_bytes() == sum(ref.size for ref in second.segments))
    assert ahead.decoded() == 0
    run.publish(1, first)
    staged = stage_version(run.store, 1, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                           decode=ahead.stage)
    assert ahead.last_decoded_ahead == 0
    with ahead.writing():
        activate(staged, target)
    prefetcher.retire(1)
    assert ahead.resume() == len(second.segments)
    wait_until(lambda: ahead.decoded() == len(second.segments))
    run.publish(2, second)
    staged = stage_version(run.store, 2, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                           decode=ahead.stage)
    assert ahead.last_decoded_ahead == len(second.segments)
    with ahead.writing():
        activate(staged, target)
    assert target.full_digest() == digest_state(LAYOUT, run.states[2]) == target.digest


def test_decoded_data_counts_against_the_budget(run):
    part = run.upload(1)
    budget = sum(ref.size for ref in part.segments) + 16  # room for the bytes, not for decoding them
    metrics, prefetcher, ahead, target = actor_side(run, budget)
    offer_all(prefetcher, run, 1, part)
    wait_until(lambda: prefetcher.held_bytes() == budget - 16)
    assert ahead.decoded() == 0 and ahead.over_budget == len(part.segments)
    manifest = run.publish(1, part)
    staged = stage_version(run.store, 1, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                           decode=ahead.stage)
    assert staged.weights_digest == manifest.weights_digest and ahead.last_decoded_ahead == 0
    assert metrics.decoded_ahead._value.get() == 0


def test_a_staging_does_not_wait_for_decodes_that_have_not_started(run):
    _, prefetcher, ahead, target = actor_side(run)
    first, second = run.upload(1), run.upload(2)
    offer_all(prefetcher, run, 2, second)
    wait_until(lambda: prefetcher.held_bytes() == sum(ref.size for ref in second.segments))
    run.publish(1, first)
    staged = stage_version(run.store, 1, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                           decode=ahead.stage)
    with ahead.writing():
        activate(staged, target)
    prefetcher.retire(1)
    busy = threading.Event()
    for _ in range(2):  # both prefetch threads busy (say, with slow reads): the decodes stay queued
        assert prefetcher.submit(busy.wait, 30)
    assert ahead.resume() == len(second.segments)
    run.publish(2, second)
    try:
        staged = stage_version(run.store, 2, target, fetch=staging_fetcher(run.store, 2, prefetcher),
                               decode=ahead.stage)
    finally:
        busy.set()
    assert ahead.last_decoded_ahead == 0, "decoded by the staging itself, not waited for"
    with ahead.writing():
        activate(staged, target)
    assert target.full_digest() == digest_state(LAYOUT, run.states[2]) == target.digest
    assert ahead.decoded() == 0 and prefetcher.reserve(prefetcher.budget_bytes), "budget not given back"
