"""The per-test figures every JUnit report carries (tests/cpu_time.py), read back from a real report."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_case_carries_its_cpu_the_machines_its_start_and_its_worker(tmp_path):
    (tmp_path / "test_burn.py").write_text(
        "import time\n"
        "def test_burn():\n"
        "    end = time.process_time() + 0.3\n"
        "    while time.process_time() < end:\n"
        "        pass\n")
    report = tmp_path / "report.xml"
    before = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "-p", "tests.cpu_time", f"--junitxml={report}", str(tmp_path / "test_burn.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_XDIST_WORKER": "gw7"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (case,) = ET.parse(report).iter("testcase")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert 0.3 <= float(properties["cpu_s"]) < 30, properties
    assert float(properties["machine_cpu_s"]) >= 0.25, properties  # the machine was busy at least as long
    assert before <= float(properties["started_at"]) <= time.time(), properties
    assert properties["worker"] == "gw7"
