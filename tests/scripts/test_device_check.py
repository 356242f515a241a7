"""``scripts/device-check`` on a machine without CUDA: its CPU smoke run of the GPU code paths (device
extraction bit-identical to the host encoder; GRPO steps published and activated by a torch actor with equal
digests) prints one JSON object and exits 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_prints_one_json_object_and_passes():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device-check"), "--smoke", "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["ok"] is True and report["cuda"] is False
    extract = report["extract"]
    assert extract["layer0_bit_identical_to_host_encoder"] is True
    assert 0.01 <= extract["density"] <= 0.04  # an Adam step at lr 1e-6 on bf16 weights
    assert extract["changed"] > 0 and extract["delta_bytes"] > 0
    run = report["train_activate"]
    assert run["actor_start_digest_equal"] and run["all_digests_equal"]
    assert [v["version"] for v in run["versions"]] == [1, 2]
    assert all(v["changed"] > 0 and v["digests_equal"] for v in run["versions"])
    assert run["generated_tokens"] > 0
