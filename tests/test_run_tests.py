"""``scripts/run-tests`` (``make test``), run on small suites of their own: the timed tests (marked ``serial``)
first, one at a time, on worker ``gw0`` at the caller's CPU priority; the rest on the other workers at the
lowest, at the same time, and on ``gw0`` too once the timed tests are done; one JUnit report; pytest's exit
status."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# On the timed worker: run from an idle-class worker (at nice 19), the priorities it checks would all be 19.
pytestmark = pytest.mark.serial

RECORD = '''
import json, os, time
from pathlib import Path

OUT = Path(os.environ["RUN_TESTS_OUT"])


def record(name, wait_for=(), hold_s=0.0):
    started = time.time()
    (OUT / f"{name}.started").touch()
    # Each waits until the others it names have started too: run one after the other, it would time out.
    deadline = time.time() + 120
    while not all((OUT / f"{other}.started").exists() for other in wait_for):
        assert time.time() < deadline, f"{name}: {wait_for} never started while it ran"
        time.sleep(0.05)
    time.sleep(hold_s)
    (OUT / f"{name}.json").write_text(json.dumps({
        "nice": os.nice(0), "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
        "worker": os.environ.get("PYTEST_XDIST_WORKER"), "vllm_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "started": started, "ended": time.time()}))
'''

#: One timed test and two others, each waiting for the other two to start: they must run at the same time.
SIDE_BY_SIDE = {
    "test_timed.py": "import pytest\nfrom record import record\n\n\n@pytest.mark.serial\ndef test_timed():\n"
                     "    record('timed', ('rest_a', 'rest_b'))\n",
    "test_rest_a.py": "from record import record\n\n\ndef test_rest_a():\n    record('rest_a', ('timed', 'rest_b'))\n",
    "test_rest_b.py": "from record import record\n\n\ndef test_rest_b():\n    record('rest_b', ('timed', 'rest_a'))\n",
}

#: Two timed tests and four others of a second each, on one worker besides the timed one.
TIMED_THEN_REST = {
    "test_timed.py": "import pytest\nfrom record import record\n\npytestmark = pytest.mark.serial\n\n\n"
                     "def test_timed_1():\n    record('timed_1', hold_s=0.3)\n\n\n"
                     "def test_timed_2():\n    record('timed_2', hold_s=0.3)\n",
    **{f"test_rest_{k}.py": f"from record import record\n\n\ndef test_rest_{k}():\n    record('rest_{k}', hold_s=1.0)\n"
       for k in "abcd"},
}

INI = '[pytest]\nmarkers =\n    serial: timed\n    long: full length\n'


def _run(tmp_path: Path, suite: dict[str, str], workers: int = 2) -> tuple[subprocess.CompletedProcess, dict, Path]:
    tests, out, reports = tmp_path / "suite", tmp_path / "out", tmp_path / "reports"
    for d in (tests, out):
        d.mkdir(parents=True, exist_ok=True)
    (tests / "pytest.ini").write_text(INI)
    (tests / "record.py").write_text(RECORD)
    for name, text in suite.items():
        (tests / name).write_text(text)
    # the runner's plugin is the project's (tests.parallel): importable from the suite's directory too
    env = {**os.environ, "RUN_TESTS_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), str(tests), os.environ.get("PYTHONPATH")) if p)}
    for inherited in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                      "VLLM_CPU_OMP_THREADS_BIND"):
        env.pop(inherited, None)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run-tests"), "--workers", str(workers),
                           "--reports", str(reports), "--", "-p", "no:cacheprovider", "-c", str(tests / "pytest.ini"),
                           "--rootdir", str(tests), str(tests)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return done, seen, reports


def test_the_timed_tests_run_beside_the_rest_at_a_higher_priority(tmp_path):
    done, seen, reports = _run(tmp_path, SIDE_BY_SIDE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(seen) == {"timed", "rest_a", "rest_b"}
    base = os.nice(0)
    assert seen["timed"]["nice"] == base and seen["timed"]["worker"] == "gw0" and not seen["timed"]["idle"]
    assert seen["timed"]["vllm_bind"] is None
    assert {seen["rest_a"]["worker"], seen["rest_b"]["worker"]} == {"gw1", "gw2"}
    for name in ("rest_a", "rest_b"):
        assert seen[name]["nice"] == 19 and seen[name]["idle"]
        # unbound: an engine's thread pinned to a core would starve there behind the timed tests
        assert seen[name]["vllm_bind"] == "nobind"
    # at the same time: each test waited for the other two to start (run in turn, the first would time out)
    cases = list(ET.parse(reports / "tests.xml").iter("testcase"))
    assert len(cases) == 3
    assert "3 passed" in done.stdout and "CPU-s" in done.stdout


def test_the_timed_worker_runs_the_timed_tests_first_then_takes_the_rest(tmp_path):
    done, seen, _ = _run(tmp_path, TIMED_THEN_REST, workers=1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(seen) == {"timed_1", "timed_2", "rest_a", "rest_b", "rest_c", "rest_d"}
    first, second = sorted((seen["timed_1"], seen["timed_2"]), key=lambda s: s["started"])
    assert first["worker"] == second["worker"] == "gw0"
    assert first["ended"] <= second["started"], "one timed test at a time"
    on_timed_worker = [s for name, s in seen.items() if name.startswith("rest_") and s["worker"] == "gw0"]
    assert on_timed_worker, "the timed worker takes the rest's units once its own are done"
    assert all(s["started"] >= second["ended"] for s in on_timed_worker)
    assert all(s["worker"] == "gw1" and s["idle"] for name, s in seen.items()
               if name.startswith("rest_") and s not in on_timed_worker)


@pytest.mark.parametrize("failing", ["test_timed", "test_rest_b"])
def test_a_failure_anywhere_fails_the_run(tmp_path, failing):
    suite = dict(SIDE_BY_SIDE)
    name = f"{failing}.py"
    # the planted failure comes after the test has started, so the others' waits still end
    suite[name] = re.sub(r"(\n    record\([^\n]*\)\n)", r"\1    assert False, 'planted'\n", suite[name])
    assert suite[name] != SIDE_BY_SIDE[name]
    done, _, _ = _run(tmp_path, suite)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "planted" in done.stdout
