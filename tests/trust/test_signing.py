"""Signed manifests: keys, signatures, and refusal before any segment is fetched."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
import torch

from aurora_store.cli import main
from aurora_store.codec import ModelLayout, TensorTarget, digest_state
from aurora_store.errors import ConfigError, ManifestError, SignatureError
from aurora_store.follow.stage import stage_version
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import write_snapshot
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.trust import Signer, Verifier, generate_keypair, key_id, write_keypair

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


@pytest.fixture()
def keypair(tmp_path):
    key, pub = write_keypair(tmp_path / "keys")
    return Signer.load(str(key)), Verifier.load(str(pub))


@pytest.fixture()
def signed_store(keypair):
    signer, _ = keypair
    store = DeltaStore(open_bucket(f"memory://{uuid.uuid4().hex}", create=True))
    states = [random_state(LAYOUT, 1)]
    for i in range(3):
        states.append(perturb(states[-1], 0.05, 50 + i))
    write_snapshot(store, 0, states[0], LAYOUT, digest_state(LAYOUT, states[0]), sign=signer)
    store.put_layout(LAYOUT)
    for v in range(1, 4):
        encoder_publish(store, states[v - 1], states[v], v, signer)
    return store, states


def encoder_publish(store, old, new, version, signer):
    from aurora_store.codec import CodecParams, pieces_from_states
    from aurora_store.store.publisher import VersionPublisher

    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), sign=signer, record_history=False)
    return publisher.publish(version, version - 1, digest_state(LAYOUT, old), pieces_from_states(LAYOUT, old, new))


def test_sign_verify_roundtrip_for_delta_and_snapshot_manifests(signed_store, keypair):
    store, _ = signed_store
    _, verify = keypair
    for v in store.versions():
        verify(store.manifest(v))
    verify(read_snapshot_manifest(store, 0))


def test_any_change_unsigned_or_foreign_key_is_refused(signed_store, keypair):
    store, _ = signed_store
    _, verify = keypair
    manifest = store.manifest(2)
    with pytest.raises(SignatureError, match="does not match"):
        verify(dataclasses.replace(manifest, weights_digest="lthash128:" + "0" * 32))
    with pytest.raises(SignatureError, match="not signed"):
        verify(manifest.with_signature(None))
    mallory = Signer.load(generate_keypair()[0])
    with pytest.raises(SignatureError, match="signed by key"):
        verify(mallory(manifest.with_signature(None)))
    forged = dict(manifest.signature)
    forged["sig"] = forged["sig"][:-4] + "AAA="
    with pytest.raises(SignatureError):
        verify(manifest.with_signature(forged))
    assert isinstance(SignatureError("x"), ManifestError)


def test_refused_before_any_segment_is_downloaded_and_weights_untouched(signed_store, keypair):
    store, states = signed_store
    _, verify = keypair
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in states[1].items()}, version=1)
    before = target.digest
    forged = dataclasses.replace(store.manifest(2), producer={"who": "relay"})  # signature no longer covers it
    store.bucket.delete(object_names.delta(2))
    store.bucket.create(object_names.delta(2), forged.to_bytes())
    for ref in forged.segments:  # had anything been fetched, this would be a missing-segment error instead
        store.bucket.delete(object_names.segment(ref.digest))
    with pytest.raises(SignatureError):
        stage_version(DeltaStore(store.bucket), 2, target, verify_manifest=verify)
    assert target.version == 1 and target.digest == before == target.full_digest()


def test_replayed_signed_manifest_under_a_new_version_name_is_refused(signed_store, keypair):
    store, states = signed_store
    _, verify = keypair
    store.bucket.put(object_names.delta(4), store.manifest_bytes(2))
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in states[3].items()}, version=3)
    with pytest.raises(ManifestError, match="version 2"):
        stage_version(DeltaStore(store.bucket), 4, target, verify_manifest=verify)


def test_key_loading_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="base64"):
        Verifier.load("not a key !!")
    with pytest.raises(ConfigError, match="32 bytes"):
        Verifier.load("AAAA")
    write_keypair(tmp_path)
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        write_keypair(tmp_path)
    private, public = generate_keypair()  # the base64 text form (e.g. from an environment variable) loads too
    assert key_id(Verifier.load(public).public_key) == key_id(Signer.load(private).public_key)


def test_aurora_verify_checks_signatures(signed_store, keypair, tmp_path, capsys):
    store, _ = signed_store
    signer, _ = keypair
    pub = tmp_path / "trainer.pub"
    import base64

    from cryptography.hazmat.primitives import serialization

    pub.write_text(base64.b64encode(signer.public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode())
    url = store.url
    assert main(["verify", url, "--public-key", str(pub)]) == 0
    forged = dataclasses.replace(store.manifest(3), producer={"who": "relay"})
    store.bucket.put(object_names.delta(3), forged.to_bytes())
    capsys.readouterr()
    assert main(["verify", url, "--public-key", str(pub)]) == 1
    assert "3" in capsys.readouterr().out
    assert main(["keygen", "--out", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "trainer.key").stat().st_mode & 0o777 == 0o600


def test_no_pickle_on_the_data_path():
    """safetensors, JSON and Parquet only: nothing in the product deserialises pickles."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    pattern = re.compile(r"\b(torch\.load|pickle\.loads?|cPickle|dill\.loads?|joblib\.load|np\.load\()")
    offenders = []
    for folder in ("aurora_store", "workers"):
        for path in (root / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "allow_pickle=False" not in line:
                    offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_signed_snapshots_and_tensors_roundtrip(signed_store):
    store, states = signed_store
    from aurora_store.store.snapshots import load_snapshot

    state, manifest = load_snapshot(store, 0, LAYOUT)
    assert manifest.signature is not None
    assert all(torch.equal(state[k].view(torch.int16), states[0][k].view(torch.int16)) for k in state)
