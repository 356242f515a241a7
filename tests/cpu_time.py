"""Each test's CPU seconds in the JUnit report, beside its wall time.

The suite's wall time on a 2-core machine is bounded by the CPU its processes burn, not by the tests' count:
a test that sleeps on a child for a minute costs little, one that starts three engines costs a core. So every
test's report carries ``cpu_s``: user + system time of the pytest process and of every child it waited for,
from the start of its setup to the end of its teardown (a module fixture's servers are charged to the test that
tears them down). ``scripts/test-durations --cpu`` turns the reports into a table by file.

Processes nobody waits for (engines' helper processes, a Ray cluster's daemons, servers a module leaves to exit
on their own) escape that count, and they can be most of a test's cost: a vLLM cluster test was charged 47 of
the 107 CPU-s the machine spent on it. So each report also carries ``machine_cpu_s``, the whole machine's busy
time over the test (``/proc/stat``). It means something only when the test ran alone (``-p no:xdist``, nothing
else running); beside other tests it counts theirs too.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from workers import forkserver

#: (this process tree's CPU seconds, the machine's busy seconds or None, Unix time) at the start of a test's setup
_START_KEY = pytest.StashKey[tuple[float, float | None, float]]()
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_cpu_seconds() -> float | None:
    """Busy seconds of every CPU since boot (user, nice, system, irq, softirq), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[1:8])
    return (user + nice + system + irq + softirq) / _TICKS_PER_S


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    # children forked from the warm template are its children: it reports their CPU when it collects them
    return total + forkserver.children_cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START_KEY] = (_cpu_seconds(), _machine_cpu_seconds(), time.time())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _START_KEY in item.stash:
        # the JUnit writer copies a teardown report's user properties onto the test case
        cpu_start, machine_start, started_at = item.stash[_START_KEY]
        report.user_properties.append(("started_at", round(started_at, 2)))
        report.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
        report.user_properties.append(("cpu_s", round(_cpu_seconds() - cpu_start, 2)))
        machine = _machine_cpu_seconds()
        if machine is not None and machine_start is not None:
            report.user_properties.append(("machine_cpu_s", round(machine - machine_start, 2)))
