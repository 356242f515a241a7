"""``aurora diff --signing-key`` and ``aurora patch --public-key`` (issue 17, case 5): with a key, an unsigned
or foreign (other key, other run) manifest is refused before any segment is fetched; keys and run also come
from the environment."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from aurora_store.cli import main
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.trust import write_keypair


@pytest.fixture()
def files(tmp_path):
    old = {"a": torch.randn(300, 7).to(torch.bfloat16), "b": torch.randn(33).half()}
    new = {"a": old["a"].clone(), "b": old["b"] * 2}
    new["a"][5, 3] += 1
    save_file(old, str(tmp_path / "old.safetensors"))
    save_file(new, str(tmp_path / "new.safetensors"))
    key, pub = write_keypair(tmp_path / "keys")
    other_key, other_pub = write_keypair(tmp_path / "other", "other")
    return tmp_path, str(key), str(pub), str(other_key), str(other_pub)


def _diff(tmp_path, bucket, *extra) -> int:
    return main(["diff", str(tmp_path / "old.safetensors"), str(tmp_path / "new.safetensors"), "--out", bucket,
                 "--version", "1", "--base", "0", *extra])


def _patch(tmp_path, bucket, *extra) -> int:
    return main(["patch", bucket, "1", "--base-file", str(tmp_path / "old.safetensors"),
                 "--out", str(tmp_path / "p.safetensors"), *extra])


def _remove_segments(bucket: str) -> None:
    """Without segments a patch can only succeed or fail *before* fetching any: proves the order."""
    shutil.rmtree(f"{bucket}/{object_names.SEGMENTS.rstrip('/')}")


def test_signed_diff_verifies_in_patch(files, capsys):
    tmp_path, key, pub, _, _ = files
    bucket = str(tmp_path / "signed")
    assert _diff(tmp_path, bucket, "--signing-key", key, "--run", "exp1") == 0
    manifest = DeltaStore(open_bucket(bucket)).manifest(1)
    assert manifest.signature is not None and manifest.producer["run"] == "exp1"
    assert _patch(tmp_path, bucket, "--public-key", pub, "--run", "exp1") == 0
    patched, new = load_file(str(tmp_path / "p.safetensors")), load_file(str(tmp_path / "new.safetensors"))
    assert all(torch.equal(patched[k], new[k]) for k in new)


@pytest.mark.parametrize(("signing", "run", "message"), [
    (None, None, "is not signed"),
    ("other", None, "is signed by key"),
    ("key", "exp2", "belongs to run 'exp2', not 'exp1'"),
])
def test_patch_with_a_key_refuses_before_fetching_segments(files, capsys, signing, run, message):
    tmp_path, key, pub, other_key, _ = files
    bucket = str(tmp_path / "b")
    extra = ["--signing-key", {"key": key, "other": other_key}[signing]] if signing else []
    assert _diff(tmp_path, bucket, *extra, *(["--run", run] if run else [])) == 0
    _remove_segments(bucket)
    capsys.readouterr()
    assert _patch(tmp_path, bucket, "--public-key", pub, "--run", "exp1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "p.safetensors").exists()


def test_keys_and_run_come_from_the_environment(files, capsys, monkeypatch):
    tmp_path, key, pub, _, _ = files
    monkeypatch.setenv("AURORA_SIGNING_KEY", key)
    monkeypatch.setenv("AURORA_RUN", "env-run")
    bucket = str(tmp_path / "env")
    assert _diff(tmp_path, bucket) == 0
    manifest = DeltaStore(open_bucket(bucket)).manifest(1)
    assert manifest.producer["run"] == "env-run"
    monkeypatch.setenv("AURORA_TRAINER_PUBLIC_KEY", pub)
    assert _patch(tmp_path, bucket) == 0
    monkeypatch.setenv("AURORA_RUN", "another")
    capsys.readouterr()
    assert _patch(tmp_path, bucket) == 2
    assert "belongs to run 'env-run'" in capsys.readouterr().err
