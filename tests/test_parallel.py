"""How ``make test`` groups and orders the suite (tests/parallel.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import parallel

ROOT = Path(__file__).resolve().parents[1]


def test_a_file_is_one_unit_except_in_spread_files():
    assert parallel.unit_of("tests/a/test_x.py::test_one[1]") == "tests/a/test_x.py"
    assert parallel.unit_of("tests/a/test_x.py::TestC::test_two") == "tests/a/test_x.py"
    chaos = f"{parallel.SPREAD[0]}::test_scenario_holds_every_invariant[relay_dies]"
    assert parallel.unit_of(chaos) == chaos


def test_longest_units_first_keeping_each_units_order():
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/b.py::t2"]
    ordered = parallel.longest_first(ids, {"tests/b.py": 30.0, "tests/c.py": 10.0})
    # b (30 s), c (10 s), then a (unrecorded: the default, below c)
    assert ordered == ["tests/b.py::t1", "tests/b.py::t2", "tests/c.py::t1", "tests/a.py::t1", "tests/a.py::t2"]
    assert sorted(ordered) == sorted(ids)


def test_every_recorded_unit_exists():
    """A stale record orders nothing: every recorded file (and spread test's file) must still be there."""
    for unit in parallel.recorded_durations():
        assert (ROOT / unit.split("::", 1)[0]).is_file(), unit


def test_durations_are_rewritten_from_junit_reports(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_parallel" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_parallel" name="test_b" time="2.0"/>'
        '<testcase classname="tests.chaos.test_chaos" name="test_scenario_holds_every_invariant[relay_dies]" '
        'time="40"/></testsuite></testsuites>')
    out = tmp_path / "durations.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "test-durations"), str(report), "--out", str(out)],
                   check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.read_text()) == {
        "tests/chaos/test_chaos.py::test_scenario_holds_every_invariant[relay_dies]": 40.0,
        "tests/test_parallel.py": 3.5}
    assert next(iter(json.loads(out.read_text()))).startswith("tests/chaos/")  # longest first
