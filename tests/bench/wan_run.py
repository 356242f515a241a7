"""Running ``python -m benchmarks wan`` as a test fixture: in its own session so that a hang can be ended (on
timeout it gets SIGTERM — its topology tears itself down on that signal — then SIGKILL), and afterwards no
namespace or process of the run may remain. Shared by the WAN benchmark tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.wan.netns import cleanup_stale, list_netns, run_prefix

REPO = Path(__file__).resolve().parents[2]


def processes_of(out: Path, prefix: str) -> list[str]:
    """Live processes holding a file under ``out`` (agents, relays, e2e workers log there) or forwarding for
    one of the run's namespaces."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "benchmarks.wan.forwarder" in cmdline and f"--run-id {prefix}" in cmdline:
                found.append(f"{entry.name}: {cmdline[:200]}")
                continue
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd).startswith(str(out)):
                    found.append(f"{entry.name}: {cmdline[:200]}")
                    break
        except OSError:
            continue
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the benchmark's process group (the topology tears down on it), then SIGKILL what is left."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (proc.poll() is None or _group_alive(proc.pid)):
            time.sleep(0.2)


def run_wan_benchmark(out: Path, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run the benchmark with ``args`` (plus ``--json --out out``); fail the test on a timeout, a non-zero exit,
    output that is not exactly one JSON object on one line, or any namespace or process left behind."""
    stdout, stderr = out / "stdout.json", out / "stderr.log"
    with open(stdout, "wb") as so, open(stderr, "wb") as se:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "wan", *args, "--json", "--out", str(out)],
                                cwd=REPO, stdout=so, stderr=se, start_new_session=True)
    prefix = run_prefix(proc.pid)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"benchmarks wan {' '.join(args)} did not finish in {timeout_s:.0f}s:\n"
                    f"{stderr.read_text()[-4000:]}")
    finally:
        end_group(proc)
        leftovers = [n for n in list_netns() if n.startswith(prefix)]
        if leftovers:  # the run's pid is gone now, so its namespaces count as stale
            cleanup_stale()
    assert not leftovers, f"namespaces left behind: {leftovers}"
    stray = processes_of(out, prefix)
    for line in stray:  # ours by construction (they hold our files): end them, then fail
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    assert not stray, f"processes left behind: {stray}"
    assert proc.returncode == 0, f"benchmark exited with {proc.returncode}:\n{stderr.read_text()[-4000:]}"
    text = stdout.read_text().strip()
    assert text.count("\n") == 0, "the output must be exactly one JSON object on one line"
    return json.loads(text)
