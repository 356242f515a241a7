"""An actor's regional copy of a version that is unparseable (1e400, 200,000 levels deep), unsigned or of
another run is read from the source bucket of the actor's own configuration instead, and the fallback is
logged (issue 17, cases 2 and 3). Before, OverflowError and RecursionError escaped the fallback and the
actor's guard made it exit 3."""

from __future__ import annotations

import dataclasses

import pytest

from aurora_store.bus import ControlPlane
from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.codec.document import canonical_json
from aurora_store.errors import SignatureError
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.replay import stage_version
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.trust import Signer, Verifier, write_keypair
from workers.actor.sources import VersionSources

pytestmark = [pytest.mark.redis]

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


def _hostile(kind: str, real, signer: Signer) -> bytes:
    if kind == "overflow":
        return real.to_bytes().replace(f'"version":{real.version}'.encode(), b'"version":1e400')
    if kind == "infinity":
        return real.to_bytes().replace(b'"elements":', b'"elements":Infinity,"x":')
    if kind == "nested":
        doc = real.to_json()
        doc.pop("producer")
        return canonical_json(doc)[:-1] + b',"producer":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    if kind == "unsigned":
        return real.with_signature(None).to_bytes()
    if kind == "foreign-run":  # validly signed by the trainer's key, for another run
        return signer(dataclasses.replace(real, producer={"run": "another-run"})).to_bytes()
    raise AssertionError(kind)


KINDS = ["overflow", "infinity", "nested", "unsigned", "foreign-run"]


@pytest.fixture()
def buckets(tmp_path):
    key, pub = write_keypair(tmp_path / "keys")
    signer = Signer.load(str(key))
    source = DeltaStore(open_bucket(str(tmp_path / "source"), create=True))
    regional = DeltaStore(open_bucket(str(tmp_path / "regional"), create=True))
    old = random_state(LAYOUT, 11)
    new = perturb(old, 0.05, 12)
    publisher = VersionPublisher(source, LAYOUT, CodecParams(segment_bytes=4096), producer={"run": "A"},
                                 sign=signer, record_history=False)
    publisher.publish(1, 0, digest_state(LAYOUT, old), pieces_from_states(LAYOUT, old, new))
    return source, regional, signer, Verifier.load(str(pub), run="A"), old


@pytest.mark.parametrize("kind", KINDS)
def test_bad_regional_manifest_is_read_from_the_source_bucket(buckets, redis_url, kind):
    source, regional, signer, verifier, old = buckets
    real = source.manifest(1)
    for ref in real.segments:  # the segments are fine; only the manifest is hostile
        regional.put_segment(ref, source.get_segment(ref))
    regional.put_layout(LAYOUT)
    regional.create_object(object_names.delta(1), _hostile(kind, real, signer))
    plane = ControlPlane(redis_url, "A")
    try:
        sources = VersionSources(regional, source, "eu-west", "us-east", plane, "eu-west-1")
        target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
        read_from = []

        def fetch(store):
            read_from.append(store.url)
            return stage_version(store, 1, target, verify_manifest=verifier)

        staged = sources.read(1, fetch)
        assert staged.weights_digest == real.weights_digest
        assert read_from == [regional.url, source.url]
        events = [e for e in plane.run_log() if e.get("kind") == "refetch_source"]
        assert [(e["actor"], e["version"]) for e in events] == [("eu-west-1", "1")]
        assert events[0]["error"] in ("ManifestError", "SignatureError")
    finally:
        plane.close()


def test_without_a_source_bucket_the_typed_error_reaches_the_caller(buckets, redis_url):
    source, regional, signer, verifier, old = buckets
    regional.create_object(object_names.delta(1), _hostile("foreign-run", source.manifest(1), signer))
    plane = ControlPlane(redis_url, "A")
    try:
        sources = VersionSources(regional, None, "eu-west", "us-east", plane, "eu-west-1")
        target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
        with pytest.raises(SignatureError, match="another-run"):
            sources.read(1, lambda store: stage_version(store, 1, target, verify_manifest=verifier))
    finally:
        plane.close()
