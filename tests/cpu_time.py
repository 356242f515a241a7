"""Each test's CPU seconds in the JUnit report, beside its wall time.

The suite's wall time on a 2-core machine is bounded by the CPU its processes burn, not by the tests' count:
a test that sleeps on a child for a minute costs little, one that starts three engines costs a core. So every
test's report carries ``cpu_s``: user + system time of the pytest process and of every child it waited for,
from the start of its setup to the end of its teardown (a module fixture's servers are charged to the test that
tears them down). ``scripts/test-durations --cpu`` turns the reports into a table by file.
"""

from __future__ import annotations

import resource

import pytest

from workers import forkserver

_START_KEY = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    # children forked from the warm template are its children: it reports their CPU when it collects them
    return total + forkserver.children_cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START_KEY] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _START_KEY in item.stash:
        # the JUnit writer copies a teardown report's user properties onto the test case
        report.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_START_KEY], 2)))
