"""``--store-and-forward``: the relay copies a version only once its manifest is announced (the baseline the
WAN benchmark compares cut-through against); by default it copies each segment as soon as it is announced."""

from __future__ import annotations

import threading
import time

import pytest

from aurora_store.bus import ControlPlane, VersionEvent
from aurora_store.codec import CodecParams, ModelLayout, digest_state, pieces_from_states
from aurora_store.store import DeltaStore, object_names
from aurora_store.store.publisher import VersionPublisher
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from workers.relay.cli import parse_args
from workers.relay.relay import Relay

pytestmark = [pytest.mark.redis]

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("store_and_forward", [False, True], ids=["cut-through", "store-and-forward"])
def test_when_the_relay_copies(redis_url, tmp_path, store_and_forward):
    run = f"relay-saf-{store_and_forward}"
    source = DeltaStore(str(tmp_path / "us-east"), create=True)
    source.put_run_info({"run": run, "home_region": "us-east"})
    old = random_state(LAYOUT, seed=5)
    new = perturb(old, 0.05, seed=6)
    relay = Relay(parse_args(["--source", str(tmp_path / "us-east"), "--dest", str(tmp_path / "eu-west"),
                              "--redis", redis_url, "--region", "eu-west", "--run", run,
                              *(["--store-and-forward"] if store_and_forward else [])]))
    thread = threading.Thread(target=relay.run, name="relay-under-test", daemon=True)
    thread.start()
    plane = ControlPlane(redis_url, run)
    try:
        assert wait_for(lambda: plane.relay("eu-west") is not None, 30), "the relay did not start"
        publisher = VersionPublisher(source, LAYOUT, CodecParams(segment_bytes=4096), 2, record_history=False)
        part, _ = publisher.upload_part(pieces_from_states(LAYOUT, old, new), on_segment=lambda ref: plane.announce(
            VersionEvent("segment", 1, "us-east", segment=ref.digest, size=ref.size)))
        dest = DeltaStore(str(tmp_path / "eu-west"))
        copied = lambda: sum(dest.has_segment(ref.digest) for ref in part.segments)  # noqa: E731
        if store_and_forward:
            time.sleep(3.0)  # longer than the relay's resync period: it had every chance to copy
            assert copied() == 0, "a store-and-forward relay copied segments before the manifest"
        else:
            assert wait_for(lambda: copied() == len(part.segments), 30), "segments were not copied as announced"
        assert not dest.bucket.exists(object_names.delta(1))  # no manifest yet, in either mode
        report = publisher.publish_parts(1, 0, digest_state(LAYOUT, old), [part])
        plane.announce(VersionEvent("staged", 1, "us-east", base=0, manifest_key=object_names.delta(1),
                                    weights_digest=report.manifest.weights_digest))
        assert wait_for(lambda: 1 in relay.forwarded, 30), "the version was not forwarded"
        assert copied() == len(part.segments) and dest.versions() == [1]
    finally:
        relay.stopping.set()
        thread.join(timeout=30)
        plane.close()
