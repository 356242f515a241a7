"""``scripts/device-check --smoke`` as the device would run it: with only the device image's packages (and what
they require) plus the wheels listed in ``scripts/device-wheels.txt`` visible — every other installed package
hidden (``python -S`` over a tree of links, :mod:`tests.scripts.device_env`). One JSON line per part on stdout
and in ``$OUT``; the list is exactly what the check imports; a missing package stops it at the environment
line; a part over its budget is reported and skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.device_env import DEVICE_IMAGE, closure, link_tree

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check"


def listed() -> list[str]:
    lines = (ROOT / "scripts" / "device-wheels.txt").read_text().splitlines()
    return [line.split("==")[0].strip() for line in (x.split("#", 1)[0] for x in lines) if line.strip()]


def check(tree: Path, out: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=f"{tree}{os.pathsep}{ROOT}", OUT=str(out))
    return subprocess.run([sys.executable, "-S", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def lines_of(proc: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def device_tree(tmp_path_factory) -> Path:
    # exactly the listed distributions, not what they require: the list must name everything imported
    return link_tree(tmp_path_factory.mktemp("device-env"), closure(DEVICE_IMAGE) | set(listed()))


@pytest.fixture(scope="module")
def smoke(device_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    proc = check(device_tree, out, "--smoke", "--steps", "2")
    return proc, out


def test_smoke_run_passes_with_only_the_device_packages_and_the_listed_wheels(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = lines_of(proc)
    assert [d["part"] for d in lines] == ["environment", "extract", "trainer", "actor", "summary"]
    assert all(d["ok"] for d in lines), lines
    # the same lines, as they were written, in $OUT
    assert [json.loads(x) for x in (out / "device-check.jsonl").read_text().splitlines()] == lines
    env, extract, trainer, actor, summary = lines
    assert env["python"] and env["torch"] and env["cuda"] is False
    assert extract["layer0_bit_identical_to_host_encoder"] is True
    assert extract["threads"] == env["threads"]  # the host baseline runs with the device run's thread count
    assert 0.01 <= extract["density"] <= 0.04  # an Adam step at lr 1e-6 on bf16 weights
    assert [v["version"] for v in trainer["versions"]] == [1, 2]
    assert all(v["changed"] > 0 and v["digest_equal"] for v in trainer["versions"])
    assert actor["start_digest_equal"] and [v["version"] for v in actor["versions"]] == [1, 2]
    assert all(v["digests_equal"] for v in actor["versions"]) and actor["generated_tokens"] > 0
    assert summary["failed"] == [] and summary["total_s"] < 420


def test_the_wheel_list_names_exactly_what_the_check_imports(smoke):
    proc, _ = smoke
    imported = set().union(*(d.get("imported_wheels", []) for d in lines_of(proc)))
    assert imported == set(listed())


def test_a_missing_package_stops_the_check_at_the_environment_line(tmp_path):
    image = closure(DEVICE_IMAGE)
    tree = link_tree(tmp_path / "bare", image)  # the device image without the wheels
    proc = check(tree, tmp_path / "out", "--smoke", timeout=120)
    assert proc.returncode == 2
    (line,) = lines_of(proc)
    assert line["part"] == "environment" and line["ok"] is False
    # a listed wheel that replaces one of the image's own (NumPy) is there, if at another version
    assert line["missing"] == [p for p in listed() if p not in image] and line["missing"]
    assert f"Python {line['python']}" in line["error"] and f"torch {line['torch']}" in line["error"]


def test_a_listed_package_that_will_not_import_stops_the_check_at_the_environment_line(device_tree, tmp_path):
    # as numba did on the first device run, refusing the image's NumPy: found, but unusable
    shadow = tmp_path / "shadow" / "numba"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.4 or less. Got NumPy 2.5.")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=os.pathsep.join([str(shadow.parent), str(device_tree), str(ROOT)]),
               OUT=str(tmp_path / "out"))
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), "--smoke"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = lines_of(proc)
    assert line["ok"] is False and "missing" not in line
    assert line["unusable"] == {"numba": "ImportError: Numba needs NumPy 2.4 or less. Got NumPy 2.5."}
    assert "numba will not import" in line["error"] and "device-wheels" in line["error"]


def test_a_part_over_its_budget_is_reported_and_skipped(device_tree, tmp_path):
    proc = check(device_tree, tmp_path, "--smoke", "--parts", "extract", "--budget", "extract=1", timeout=120)
    assert proc.returncode == 1
    env, extract, summary = lines_of(proc)
    assert env["ok"]
    assert extract == {"part": "extract", "ok": False, "skipped": "over its budget of 1 s", "budget_s": 1.0}
    assert summary["ok"] is False and summary["failed"] == ["extract"]
