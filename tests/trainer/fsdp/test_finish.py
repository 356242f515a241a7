"""How a trainer rank ends: a sharded rank skips interpreter finalization (where gloo's worker threads can
abort it after a successful run) but keeps its output and its exit code; a single rank exits normally."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def probe(code: int, ranks: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    return subprocess.run([sys.executable, *launcher, "-m", "tests.trainer.fsdp.finish_probe", str(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)


def test_sharded_ranks_keep_their_output_and_skip_finalization():
    proc = probe(0, 2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rank 0 gathered [0.0, 0.0, 1.0, 1.0]" in proc.stdout
    assert "rank 0 of 2 done" in proc.stdout and "rank 1 of 2 done" in proc.stdout
    assert "finalized" not in proc.stdout


def test_a_sharded_ranks_exit_code_reaches_the_launcher():
    proc = probe(3, 2)
    assert proc.returncode != 0
    assert "exitcode  : 3" in proc.stderr, proc.stderr[-4000:]


def test_a_single_rank_returns_its_code_and_exits_normally():
    proc = probe(5, 1)
    assert proc.returncode == 5, proc.stderr[-4000:]
    assert "rank 0 of 1 done" in proc.stdout and "rank 0 finalized" in proc.stdout
