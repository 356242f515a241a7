"""An actor started before its trainer waits for the run's first snapshot (spot VMs come up in any order), and
one that waits past ``--wait-for-run`` exits with an error naming the bucket and the flag — a real actor
process against a real Redis and an empty local bucket."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.redis


def _actor(tmp_path, redis_url: str, wait_s: str) -> subprocess.Popen:
    bucket = tmp_path / "bucket"
    bucket.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "workers.actor", "--bucket", str(bucket), "--redis", redis_url, "--region", "r1",
         "--run", "early", "--engine", "torch", "--wait-for-run", wait_s, "--cache-dir", str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_an_actor_gives_up_after_wait_for_run_with_a_clear_error(tmp_path, redis_url):
    started = time.monotonic()
    proc = _actor(tmp_path, redis_url, "2")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "no run and snapshot appeared" in out and "--wait-for-run" in out, out[-2000:]
    assert time.monotonic() - started < 90


def test_an_actor_keeps_waiting_within_wait_for_run(tmp_path, redis_url):
    proc = _actor(tmp_path, redis_url, "0")  # 0: for ever
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=8)  # long past the 2 s above: still waiting, not failed
    finally:
        proc.kill()
        proc.wait()
