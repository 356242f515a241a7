"""A follower's regional copy of a version that is unparseable (1e400, 200,000 levels deep), unsigned or of
another run is read from the source bucket of its chain instead, and the fallback is reported (issue 17,
cases 2 and 3). Before, OverflowError and RecursionError escaped the fallback and the actor's guard made it
exit 3."""

from __future__ import annotations

import dataclasses

import pytest

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.codec.document import canonical_json
from aurora_store.errors import SignatureError
from aurora_store.follow import BucketChain, Follower, Step
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.trust import Signer, Verifier, write_keypair

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
def test_bad_regional_manifest_is_read_from_the_source_bucket(buckets, kind):
    source, regional, signer, verifier, old = buckets
    real = source.manifest(1)
    for ref in real.segments:  # the segments are fine; only the manifest is hostile
        regional.put_segment(ref, source.get_segment(ref))
    regional.put_layout(LAYOUT)
    regional.create_object(object_names.delta(1), _hostile(kind, real, signer))
    refetched: list[tuple[int, str]] = []
    chain = BucketChain(regional, source, on_refetch=lambda v, exc: refetched.append((v, type(exc).__name__)))
    reads: list[str] = []
    follower = Follower(chain, verify=verifier, on_read=lambda label, _n: reads.append(label))
    follower.attach(TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0))
    staged = follower.stage(Step(1))
    assert staged.weights_digest == real.weights_digest
    # the regional manifest was refused before any of its segments was fetched; the source's were read once
    assert len(reads) == len(real.segments)
    assert [v for v, _ in refetched] == [1]
    assert refetched[0][1] in ("ManifestError", "SignatureError")


def test_without_a_source_bucket_the_typed_error_reaches_the_caller(buckets):
    source, regional, signer, verifier, old = buckets
    regional.create_object(object_names.delta(1), _hostile("foreign-run", source.manifest(1), signer))
    follower = Follower(BucketChain(regional), verify=verifier)
    follower.attach(TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0))
    with pytest.raises(SignatureError, match="another-run"):
        follower.stage(Step(1))
