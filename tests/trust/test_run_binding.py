"""Signatures bind the run (issue 17, case 3): a validly signed manifest of run B is refused by a reader of
run A holding the same key, before any segment is fetched."""

from __future__ import annotations

import uuid

import pytest

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.errors import SignatureError
from aurora_store.follow.stage import stage_version
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.trust import RunCheck, Signer, Verifier, manifest_check, write_keypair

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


class CountingStore(DeltaStore):
    fetched = 0

    def get_segment(self, ref):
        CountingStore.fetched += 1
        return super().get_segment(ref)


@pytest.fixture()
def run_b(tmp_path):
    key, pub = write_keypair(tmp_path / "keys")
    store = CountingStore(open_bucket(f"memory://{uuid.uuid4().hex}", create=True))
    old = random_state(LAYOUT, 5)
    new = perturb(old, 0.05, 6)
    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), producer={"run": "B"},
                                 sign=Signer.load(str(key)), record_history=False)
    publisher.publish(1, 0, digest_state(LAYOUT, old), pieces_from_states(LAYOUT, old, new))
    return store, str(pub), old


def test_manifest_of_another_run_is_refused_before_any_segment(run_b):
    store, pub, old = run_b
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
    CountingStore.fetched = 0
    with pytest.raises(SignatureError, match="run 'B', not 'A'"):
        stage_version(store, 1, target, verify_manifest=Verifier.load(pub, run="A"))
    assert CountingStore.fetched == 0
    # the same key and run B accepts it; no run given accepts any run
    stage_version(store, 1, target, verify_manifest=Verifier.load(pub, run="B"))
    stage_version(store, 1, target, verify_manifest=Verifier.load(pub))


def test_manifest_check_builds_what_a_reader_was_given(run_b):
    store, pub, _ = run_b
    assert manifest_check(None, None) is None
    assert isinstance(manifest_check(None, "A"), RunCheck)
    checker = manifest_check(pub, "A")
    assert isinstance(checker, Verifier) and checker.run == "A"
    with pytest.raises(SignatureError):
        RunCheck("A")(store.manifest(1))
    RunCheck("B")(store.manifest(1))
