"""The command line on the edge cases of issue 17, case 8: refused before any upload (no orphans, no stray
``layouts/`` entry or temp file), one clear line and exit code 2; empty tensors carried like any other."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from aurora_store.cli import main


@pytest.fixture()
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = {"w": torch.randn(64, 8).to(torch.bfloat16), "empty": torch.zeros(0, dtype=torch.bfloat16),
           "empty2": torch.zeros(3, 0, dtype=torch.float16)}
    new = {k: v.clone() for k, v in old.items()}
    new["w"][0, 0] += 1
    save_file(old, "old.st")
    save_file(new, "new.st")
    return tmp_path, new


def _tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files}


def _refused(capsys, argv, needle) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"aurora {argv[0]}: error:") and needle in err[0], err


def test_empty_tensors_are_carried(work, capsys):
    _, new = work
    assert main(["diff", "old.st", "new.st", "--out", "bk", "--version", "1", "--base", "0"]) == 0
    assert main(["patch", "bk", "1", "--base-file", "old.st", "--out", "p.st"]) == 0
    patched = load_file("p.st")
    assert {k: tuple(v.shape) for k, v in patched.items()} == {"w": (64, 8), "empty": (0,), "empty2": (3, 0)}
    assert all(torch.equal(patched[k], new[k]) for k in new)


def test_diff_refusals_upload_nothing(work, capsys):
    tmp_path, _ = work
    assert main(["diff", "old.st", "new.st", "--out", "bk", "--version", "1", "--base", "0"]) == 0
    before = _tree(tmp_path / "bk")
    _refused(capsys, ["diff", "old.st", "new.st", "--out", "bk", "--version", "1", "--base", "0"],
             "already published")
    _refused(capsys, ["diff", "old.st", "new.st", "--out", "bk", "--version", str(10**13), "--base", "0"],
             "out of range")
    assert _tree(tmp_path / "bk") == before  # no orphan segment, no layout, no history row


def test_long_tensor_name_is_refused_before_the_bucket_exists(work, capsys):
    name = "x" * 2000
    save_file({name: torch.zeros(4, dtype=torch.bfloat16)}, "la.st")
    save_file({name: torch.ones(4, dtype=torch.bfloat16)}, "lb.st")
    _refused(capsys, ["diff", "la.st", "lb.st", "--out", "bk2", "--version", "1", "--base", "0"], "1024")
    assert not os.path.exists("bk2")


def test_out_is_a_regular_file(work, capsys):
    with open("afile", "w") as handle:
        handle.write("x")
    _refused(capsys, ["diff", "old.st", "new.st", "--out", "afile", "--version", "1", "--base", "0"],
             "is a file, not a bucket directory")


def test_patch_out_into_a_missing_directory_or_onto_a_directory(work, capsys):
    del work
    assert main(["diff", "old.st", "new.st", "--out", "bk", "--version", "1", "--base", "0"]) == 0
    _refused(capsys, ["patch", "bk", "1", "--base-file", "old.st", "--out", "nodir/x.st"], "does not exist")
    os.mkdir("adir")
    _refused(capsys, ["patch", "bk", "1", "--base-file", "old.st", "--out", "adir"], "is a directory")
    assert not [p for p in os.listdir(".") if p.endswith(".tmp")] and os.listdir("adir") == []


def test_log_with_a_corrupt_history_row(work, capsys):
    assert main(["diff", "old.st", "new.st", "--out", "bk", "--version", "1", "--base", "0"]) == 0
    os.makedirs("bk/history", exist_ok=True)
    with open("bk/history/000000000009.parquet", "wb") as handle:
        handle.write(b"PAR1 not parquet")
    _refused(capsys, ["log", "bk"], "000000000009.parquet is not a readable history row")
