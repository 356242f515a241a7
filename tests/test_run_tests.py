"""``scripts/run-tests`` (``make test``), run on a small suite of its own: the timed tests (marked
``serial``) at the caller's CPU priority, the rest on xdist workers at the lowest, both passes at the same time,
a JUnit report each, and the exit status of whichever failed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# In the timed pass: run from the rest (at nice 19) the two priorities it checks would both be 19.
pytestmark = pytest.mark.serial

SUITE = '''
import json, os, time
from pathlib import Path

import pytest

OUT = Path(os.environ["RUN_TESTS_OUT"])


def record(name, wait_for=()):
    (OUT / f"{name}.started").touch()
    # Each waits until the others it names have started too: run one after the other, it would time out.
    deadline = time.time() + 120
    while not all((OUT / f"{other}.started").exists() for other in wait_for):
        assert time.time() < deadline, f"{name}: {wait_for} never started while it ran"
        time.sleep(0.05)
    (OUT / f"{name}.json").write_text(json.dumps({"nice": os.nice(0), "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
                                                   "xdist": os.environ.get("PYTEST_XDIST_WORKER"),
                                                   "vllm_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}))


@pytest.mark.serial
def test_timed():
    record("timed", ("rest_a", "rest_b"))


def test_rest_a():
    record("rest_a", ("timed", "rest_b"))


def test_rest_b():
    record("rest_b", ("timed", "rest_a"))
'''

INI = '[pytest]\nmarkers =\n    serial: timed\n    long: full length\n'


def _run(tmp_path: Path, suite: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    tests, out, reports = tmp_path / "suite", tmp_path / "out", tmp_path / "reports"
    for d in (tests, out):
        d.mkdir(parents=True, exist_ok=True)
    (tests / "pytest.ini").write_text(INI)
    (tests / "test_suite.py").write_text(suite)
    env = {**os.environ, "RUN_TESTS_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run-tests"), "--workers", "2", "--reports",
                           str(reports), "--", "-p", "no:cacheprovider", "-c", str(tests / "pytest.ini"),
                           "--rootdir", str(tests), str(tests)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done, out, reports


def test_the_timed_tests_run_beside_the_rest_at_a_higher_priority(tmp_path):
    done, out, reports = _run(tmp_path, SUITE)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(seen) == {"timed", "rest_a", "rest_b"}
    base = os.nice(0)
    assert seen["timed"]["nice"] == base and seen["timed"]["xdist"] is None and not seen["timed"]["idle"]
    for name in ("rest_a", "rest_b"):
        assert seen[name]["nice"] == 19 and seen[name]["idle"] and seen[name]["xdist"] is not None
        # unbound: an engine's thread pinned to a core would starve there behind the timed tests
        assert seen[name]["vllm_bind"] == "nobind"
    assert seen["timed"]["vllm_bind"] is None
    # at the same time: each test waited for the other two to start (run in turn, the first would time out)
    for report in ("serial.xml", "parallel.xml"):
        assert "<testcase" in (reports / report).read_text()
    assert "the timed tests" in done.stdout and "1 passed" in done.stdout


def test_a_failure_in_either_pass_fails_the_run(tmp_path):
    for failing in ("test_timed", "test_rest_b"):
        # the planted failure comes after the test has started, so the others' waits still end
        suite = re.sub(rf"(def {failing}\(\):\n    record\([^\n]*\)\n)", r"\1    assert False, 'planted'\n", SUITE)
        assert suite != SUITE
        done, _, _ = _run(tmp_path / failing, suite)
        assert done.returncode == 1, (failing, done.stdout[-2000:])
        assert "planted" in done.stdout
