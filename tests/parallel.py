"""How ``make test`` spreads the suite over pytest-xdist workers.

Most of the suite waits on real processes (trainers, actors, relays, servers starting, leases expiring), so a
few workers share two cores well. Two rules decide what runs where:

* **A file is one unit of work**, so that what a module's fixtures pay for once (a vLLM engine, a published run,
  a local cluster) is paid once; except in :data:`SPREAD`, whose tests are independent runs that gain nothing
  from sharing a worker (each chaos scenario starts its own cluster).
* **The longest units start first** (longest-processing-time-first): the recorded durations in
  ``tests/durations.json`` order the units, so that the run does not end with one long file started last. A unit
  missing from the record counts as :data:`DEFAULT_S`. ``scripts/test-durations`` rewrites the record from a
  JUnit XML report of a full run.

Tests that judge time or throughput carry the ``serial`` marker and are not part of the parallel pass: ``make
test`` runs them one at a time beside it, at a higher CPU priority than it (``scripts/run-tests``).
"""

from __future__ import annotations

import json
from pathlib import Path

#: Test files whose tests are spread one by one rather than kept together.
SPREAD = ("tests/chaos/test_chaos.py",)

DURATIONS = Path(__file__).with_name("durations.json")

DEFAULT_S = 5.0


def unit_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: its file, or itself in a :data:`SPREAD` file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPREAD else path


def recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


def longest_first(nodeids: list[str], durations: dict[str, float]) -> list[str]:
    """``nodeids`` regrouped by unit, the units in decreasing recorded duration (ties: first collected first);
    the order inside a unit is kept."""
    units: dict[str, list[str]] = {}
    for nodeid in nodeids:
        units.setdefault(unit_of(nodeid), []).append(nodeid)
    ordered = sorted(units.items(), key=lambda item: -durations.get(item[0], DEFAULT_S))
    return [nodeid for _, members in ordered for nodeid in members]


def make_scheduler(config, log):
    """A pytest-xdist scheduler that hands out :func:`unit_of` units in collection order (which
    :func:`longest_first` has set)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the longest-first order, not xdist's count-of-tests order
    return UnitScheduling(config, log)
