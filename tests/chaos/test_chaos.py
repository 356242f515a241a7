"""The chaos suite (quick versions): every scenario against real processes, a real Redis and real buckets
(and the real S3 server behind a fault-injecting proxy), with the invariants checked after each.

``make chaos`` runs the longer versions and prints the figures as one JSON object.
"""

from __future__ import annotations

import json

import pytest

from workers.chaos.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.redis]


#: Scenarios whose invariants judge time (heterogeneous_actors: proportional allocation ≥ 25 % faster than a uniform
#: split), so they run with the cores theirs when they want them (``make test`` runs timed tests on a worker of
#: their own).
TIMED = {"heterogeneous_actors"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.serial) if n in TIMED else n for n in SCENARIOS])
def test_scenario_holds_every_invariant(name, tmp_path):
    result = SCENARIOS[name](tmp_path, True)
    report = json.dumps(result.as_dict(), indent=1, default=str)
    assert result.invariants, report
    failed = [k for k, ok in result.invariants.items() if not ok]
    assert not failed, f"{name}: invariants failed: {failed}\n{report}"
