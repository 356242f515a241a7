"""``aurora diff`` / ``patch`` / ``log`` on real files, a local bucket and the real S3 server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from aurora_store.cli import main
from aurora_store.codec import ModelLayout
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


@pytest.fixture()
def checkpoints(tmp_path):
    states = [random_state(LAYOUT, 11)]
    for i in range(3):
        states.append(perturb(states[-1], 0.04, 200 + i))
    paths = []
    for i, state in enumerate(states):
        path = tmp_path / f"step{i}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})
        paths.append(path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_QWEN3))
    return paths, config


def run_json(argv, capsys) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_diff_patch_roundtrip_is_bit_exact(checkpoints, tmp_path, capsys, backend, request):
    paths, config = checkpoints
    out = str(tmp_path / "bucket") if backend == "local" else request.getfixturevalue("s3_bucket_url")
    for v in range(1, 4):
        doc = run_json(["diff", str(paths[v - 1]), str(paths[v]), "--out", out, "--version", str(v),
                        "--base", str(v - 1), "--config", str(config), "--json"], capsys)
        assert doc["version"] == v and 0.02 < doc["density"] < 0.08
        assert doc["delta_bytes"] < doc["full_bytes"] / 5
    patched = tmp_path / "patched.safetensors"
    doc = run_json(["patch", out, "3", "--base-file", str(paths[0]), "--base", "0", "--out", str(patched),
                    "--json"], capsys)
    assert doc["applied"] == [1, 2, 3]
    assert patched.read_bytes() == paths[3].read_bytes()  # same tensors, same metadata: same file
    log = run_json(["log", out, "--json"], capsys)
    assert [r["version"] for r in log["versions"]] == [1, 2, 3]
    assert all(r["segments"] >= 1 and r["delta_bytes"] > 0 for r in log["versions"])


def test_identity_layout_without_config(tmp_path, capsys):
    old = {"a": torch.randn(100, 7).to(torch.bfloat16), "b": torch.randn(3).half()}
    new = {"a": old["a"].clone(), "b": old["b"] * 2}
    new["a"][5, 3] = float("nan")
    save_file(old, str(tmp_path / "old.safetensors"))
    save_file(new, str(tmp_path / "new.safetensors"))
    bucket = str(tmp_path / "b")
    run_json(["diff", str(tmp_path / "old.safetensors"), str(tmp_path / "new.safetensors"), "--out", bucket,
              "--version", "1", "--base", "0", "--json"], capsys)
    assert main(["patch", bucket, "1", "--base-file", str(tmp_path / "old.safetensors"),
                 "--out", str(tmp_path / "p.safetensors")]) == 0
    patched = load_file(str(tmp_path / "p.safetensors"))
    for name in new:
        assert torch.equal(patched[name].view(torch.int16), new[name].view(torch.int16))


def test_bad_input_gives_clear_errors_and_exit_code_2(checkpoints, tmp_path, capsys):
    paths, config = checkpoints
    bucket = str(tmp_path / "bucket")
    assert main(["diff", str(tmp_path / "missing.safetensors"), str(paths[1]), "--out", bucket,
                 "--version", "1", "--base", "0"]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file")
    assert main(["diff", str(tmp_path / "garbage.safetensors"), str(paths[1]), "--out", bucket,
                 "--version", "1", "--base", "0"]) == 2
    assert "safetensors" in capsys.readouterr().err
    assert main(["diff", str(paths[0]), str(paths[1]), "--out", bucket, "--version", "1", "--base", "1"]) == 2
    assert main(["diff", str(paths[0]), str(paths[1]), "--out", bucket, "--version", "1", "--base", "0",
                 "--config", str(config)]) == 0
    capsys.readouterr()
    # publishing a different delta under the same version is refused
    assert main(["diff", str(paths[0]), str(paths[2]), "--out", bucket, "--version", "1", "--base", "0",
                 "--config", str(config)]) == 2
    assert "already published" in capsys.readouterr().err
    # a base file that is not the declared base version is refused, and no output is written
    out = tmp_path / "never.safetensors"
    assert main(["patch", bucket, "1", "--base-file", str(paths[2]), "--out", str(out)]) == 2
    assert "digest" in capsys.readouterr().err and not out.exists()
    assert main(["patch", bucket, "9", "--base-file", str(paths[0]), "--out", str(out)]) == 2
    assert "not published" in capsys.readouterr().err
    assert main(["log", str(tmp_path / "nowhere")]) == 2


def test_console_script_runs_as_a_process(checkpoints, tmp_path):
    paths, config = checkpoints
    bucket = tmp_path / "bucket"
    cmd = [sys.executable, "-m", "aurora_store.cli", "diff", str(paths[0]), str(paths[1]), "--out", str(bucket),
           "--version", "1", "--base", "0", "--config", str(config)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "published version 1" in result.stdout
    result = subprocess.run([sys.executable, "-m", "aurora_store.cli", "log", str(bucket)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "density" in result.stdout
