"""Regions on their own CPUs (``benchmarks.wan.affinity``): the split of the allowed CPUs, and pinning a real
process tree — every thread of the process and of a grandchild started before the pin, and a thread started
after it — then releasing it again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.wan.affinity import all_cpus, pin_tree, split_cpus

# A parent with one extra thread that starts a grandchild, then (on a line on stdin) one more thread; it prints
# its threads' and the grandchild's pids.
TREE = r"""
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
sys.stdin.readline()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("late", flush=True)
time.sleep(60)
"""


def test_split_deals_contiguous_near_equal_shares():
    assert split_cpus(["home", "remote"], [0, 1]) == {"home": frozenset({0}), "remote": frozenset({1})}
    assert split_cpus(["a", "b"], [4, 5, 6, 7, 8]) == {"a": frozenset({4, 5, 6}), "b": frozenset({7, 8})}
    assert split_cpus(["a", "b", "c"], [0, 1]) is None  # fewer CPUs than regions: nothing to separate
    assert split_cpus(["a"]) == {"a": all_cpus()}


def _affinities(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(all_cpus()) < 2, reason="needs two allowed CPUs to pin to a strict subset")
def test_pin_tree_reaches_every_thread_and_descendant_and_is_inherited():
    one = frozenset({min(all_cpus())})
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pin_tree(proc.pid, one) >= 3  # the parent's two threads and the grandchild
        assert _affinities(proc.pid) == {one} and _affinities(grandchild) == {one}
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "late"
        assert _affinities(proc.pid) == {one}  # a thread started afterwards inherits the pin
        pin_tree(proc.pid, all_cpus())
        assert _affinities(proc.pid) == {all_cpus()} and _affinities(grandchild) == {all_cpus()}
    finally:
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
        proc.kill()
        proc.wait(10)


def test_pin_tree_of_a_process_that_is_gone_sets_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    assert pin_tree(proc.pid, all_cpus()) == 0
