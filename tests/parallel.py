"""How ``make test`` spreads the suite over pytest-xdist workers (a pytest plugin: ``-p tests.parallel``, also
listed by ``tests/conftest.py``).

Most of the suite waits on real processes (trainers, actors, relays, servers starting, leases expiring), so a
few workers share two cores well. Two rules decide what runs where:

* **A file is one unit of work**, so that what a module's fixtures pay for once (a vLLM engine, a published run,
  a local cluster) is paid once; except in :data:`SPREAD`, whose tests are independent runs that gain nothing
  from sharing a worker (each chaos scenario starts its own cluster).
* **The longest units start first** (longest-processing-time-first): the recorded durations in
  ``tests/durations.json`` order the units, so that the run does not end with one long file started last. A unit
  missing from the record counts as :data:`DEFAULT_S`. ``scripts/test-durations`` rewrites the record from a
  JUnit XML report of a full run.

With ``--timed-first`` (``scripts/run-tests`` passes it), one worker, :data:`TIMED_WORKER`, is kept for the
tests that judge time or throughput (marked ``serial``): it runs them one at a time, first, at the caller's
CPU priority, and only then takes the rest's units like any worker. Every other worker runs at the lowest
priority (``nice 19`` in the idle scheduling class, inherited by every server, engine and cluster process it
starts; but those in sessions of their own are, with autogroups, CPU groups of their own at full weight: the
README says why they stay so), so a timed test that wakes goes ahead of the workers themselves. Once the
timed tests are done, the timed worker's core goes to the rest: no core waits while one worker finishes a
queue.

The controller schedules but does not collect, so it cannot read markers: each worker writes the node ids of
the timed tests it collected to a file the controller named (:func:`pytest_configure_node`), and the scheduler
reads it when every worker has collected.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import pytest

#: Test files whose tests are spread one by one rather than kept together.
SPREAD = ("tests/chaos/test_chaos.py",)

DURATIONS = Path(__file__).with_name("durations.json")

DEFAULT_S = 5.0

#: The marker of the tests that judge time or throughput.
TIMED_MARKER = "serial"

#: The worker that runs them.
TIMED_WORKER = "gw0"

_TIMED_LIST_KEY = "aurora_timed_nodeids"

#: (Controller) the file the workers write the timed tests' node ids to.
_TIMED_LIST_PATH = pytest.StashKey[Path]()


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


def background() -> None:
    """The lowest CPU priority, inherited by every process this one starts: nice 19, and the idle scheduling
    class where the kernel has it. Under nice alone a timed test that wakes (a packet arrives, a sleep ends) can
    wait for a background task's slice to end; an idle-class task gives way at once."""
    os.nice(19 - os.nice(0))
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted: nice 19 alone
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


# --- the plugin's hooks ----------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timed-first", action="store_true", default=False,
                     help=f"with -n: worker {TIMED_WORKER} runs the tests marked {TIMED_MARKER!r} first, one at "
                          "a time at normal priority; the other workers run at the lowest (tests/parallel.py)")


def _worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    worker = _worker_id(config)
    if worker is None or not config.getoption("timed_first") or worker == TIMED_WORKER:
        return
    background()
    # vLLM's CPU engines leave their OpenMP threads unbound (unless the caller chose). By default vLLM binds its
    # one compute thread to one core; in the idle class such a thread starves for as long as a timed test keeps
    # that core busy (the WAN benchmark pins its regions to cores), and each forward pass waits on it. Measured:
    # a MoE cluster's vLLM actor made no progress for 165 s. Unbound, it runs on whichever core is free, at the
    # same speed when both are.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(Controller) where the workers write the timed tests' node ids."""
    if node.config.getoption("timed_first"):
        node.workerinput[_TIMED_LIST_KEY] = str(_timed_list_path(node.config))


def _timed_list_path(config: pytest.Config) -> Path:
    if _TIMED_LIST_PATH not in config.stash:
        handle, name = tempfile.mkstemp(prefix="aurora-timed-", suffix=".json")
        os.close(handle)
        path = config.stash[_TIMED_LIST_PATH] = Path(name)
        config.add_cleanup(lambda: path.unlink(missing_ok=True))
    return config.stash[_TIMED_LIST_PATH]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:  # not an xdist worker: collection order
        return
    # every worker sorts alike, so their collections stay identical
    order = {nodeid: i for i, nodeid in enumerate(longest_first([i.nodeid for i in items], recorded_durations()))}
    items.sort(key=lambda item: order[item.nodeid])
    if _TIMED_LIST_KEY in workerinput:
        timed = [item.nodeid for item in items if item.get_closest_marker(TIMED_MARKER) is not None]
        target = Path(workerinput[_TIMED_LIST_KEY])
        scratch = target.with_name(f"{target.name}.{workerinput['workerid']}")
        scratch.write_text(json.dumps(timed))
        os.replace(scratch, target)  # whole, whichever worker writes last (they all write the same)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return make_scheduler(config, log)


def make_scheduler(config, log):
    """A pytest-xdist scheduler that hands out :func:`unit_of` units in collection order (which
    :func:`longest_first` has set); with ``--timed-first``, the timed tests' units to :data:`TIMED_WORKER` only,
    before anything else."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self._timed_list = _timed_list_path(config) if config.getoption("timed_first") else None
            self._timed: frozenset[str] | None = None

        def _timed_nodeids(self) -> frozenset[str]:
            # read once every worker has collected (the first scope split happens in schedule())
            if self._timed is None:
                self._timed = frozenset(json.loads(self._timed_list.read_text() or "[]")) \
                    if self._timed_list is not None else frozenset()
            return self._timed

        def _split_scope(self, nodeid: str) -> str:
            unit = unit_of(nodeid)
            return f"timed:{unit}" if nodeid in self._timed_nodeids() else unit

        def _timed_node(self):
            nodes = self.nodes
            # the worker that runs them at normal priority, or (it crashed and was replaced) any worker
            return next((n for n in nodes if n.gateway.id == TIMED_WORKER), nodes[0] if nodes else None)

        def _next_unit(self, node) -> str | None:
            timed_node = node is self._timed_node()
            units = list(self.workqueue)
            if timed_node:
                return next((u for u in units if u.startswith("timed:")), units[0] if units else None)
            return next((u for u in units if not u.startswith("timed:")), None)

        def _assign_work_unit(self, node) -> None:
            scope = self._next_unit(node)
            if scope is None:
                return
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if self._next_unit(node) is None:  # nothing this worker may take will come: it finishes and leaves
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 2:  # xdist's heuristic: top up at two tests left
                return
            self._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the longest-first order, not xdist's count-of-tests order
    return UnitScheduling(config, log)
