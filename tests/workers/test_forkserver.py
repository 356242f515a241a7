"""The warm template the suite starts its cluster processes from: a forked child must behave as the same
``python -m module`` started from a fresh interpreter would, and be driven like a ``subprocess.Popen``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from workers import forkserver
from workers.launch import ProcessGroup


@pytest.fixture(scope="module")
def server():
    server = forkserver.ForkServer()
    yield server
    server.close()


def test_a_child_runs_its_module_with_its_arguments_environment_and_directory(server, tmp_path):
    log = tmp_path / "child.log"
    env = {**os.environ, "AURORA_PROBE": "seen"}
    child = server.start("workers.relay", ["--help"], env=env, log_path=log, cwd=tmp_path)
    assert child.wait(timeout=60) == 0
    text = log.read_text()
    assert "usage: python -m workers.relay" in text or "--bucket" in text, text[-500:]
    # argument errors exit 2 through argparse, as from a fresh interpreter
    bad = server.start("workers.actor", ["--no-such-flag"], env=env, log_path=tmp_path / "bad.log")
    assert bad.wait(timeout=60) == 2
    assert "unrecognized arguments" in (tmp_path / "bad.log").read_text() or \
        "required" in (tmp_path / "bad.log").read_text()


def test_a_child_is_a_session_of_its_own_named_by_its_module_and_dies_by_signal(server, tmp_path):
    env = {**os.environ, "AURORA_STOP_GRACE_S": "30"}
    child = server.start("workers.relay", ["--bucket", f"file://{tmp_path}/b", "--redis", "redis://127.0.0.1:1",
                                           "--region", "r", "--source-bucket", f"file://{tmp_path}/a"],
                         env=env, log_path=tmp_path / "relay.log")
    try:
        assert os.getpgid(child.pid) == child.pid and os.getsid(child.pid) == child.pid
        with open(f"/proc/{child.pid}/comm") as comm:
            assert comm.read().strip() == "workers.relay"
        assert child.poll() is None and not child.exited()
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(ProcessLookupError):  # collected: the pid is free
        os.kill(child.pid, 0)


def test_wait_with_a_timeout_raises_like_popen(server, tmp_path):
    # any accepted module will do; a relay without Redis keeps retrying, so it outlives the timeout
    child = server.start("workers.relay", ["--bucket", f"file://{tmp_path}/b", "--redis", "redis://127.0.0.1:1",
                                           "--region", "r", "--source-bucket", f"file://{tmp_path}/a"],
                         env=dict(os.environ), log_path=tmp_path / "relay.log")
    try:
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        child.kill()
        child.wait(timeout=30)


def test_the_cpu_of_collected_children_is_reported(server, tmp_path):
    before = server.children_cpu_s
    child = server.start("workers.relay", ["--help"], env=dict(os.environ), log_path=tmp_path / "x.log")
    child.wait(timeout=60)
    assert server.children_cpu_s > before


def test_an_environment_that_changes_what_imports_read_is_refused(server):
    base = dict(os.environ)
    assert server.accepts("workers.actor", {**base, "PYTHONUNBUFFERED": "1", "AURORA_X": "1"}, None)
    for key in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "PYTHONHASHSEED", "LD_PRELOAD", "HF_HUB_OFFLINE"):
        assert not server.accepts("workers.actor", {**base, key: "7"}, None), key
    assert not server.accepts("workers.actor", base, ["taskset", "-c", "0"])
    assert not server.accepts("benchmarks.wan", base, None)


def test_a_process_group_forks_from_a_template_of_its_childs_import_time_environment(tmp_path):
    group = ProcessGroup(tmp_path)
    with group:
        fresh = group.start("d", "workers.demo", ["--help"])  # not a module the template runs
        assert isinstance(fresh.process, subprocess.Popen) and fresh.process.args[:3] == \
            [sys.executable, "-m", "workers.demo"]
        fresh.process.wait(timeout=120)
        forked = group.start("f", "workers.relay", ["--help"])
        forked.process.wait(timeout=60)
        other = "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2"
        pinned = group.start("p", "workers.relay", ["--help"], env={"OMP_NUM_THREADS": other})
        pinned.process.wait(timeout=60)
    assert isinstance(forked.process, forkserver.ForkedProcess)  # the suite starts from the template
    assert isinstance(pinned.process, forkserver.ForkedProcess)
    assert fresh.process.returncode == forked.process.returncode == pinned.process.returncode == 0
    # the child whose thread count the imports read came from a template started with that count
    assert forkserver.shared({**os.environ, "OMP_NUM_THREADS": other}) is not forkserver.shared()
    assert forkserver.shared({**os.environ, "OMP_NUM_THREADS": other}).env["OMP_NUM_THREADS"] == other
