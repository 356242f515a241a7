"""The WAN benchmark's quick run (parts 1–4), once per session for every test that reads it."""

from __future__ import annotations

import pytest

from tests.bench.wan_run import run_wan_benchmark

#: About three minutes on two quiet cores; the limit leaves room for a busy machine.
WAN_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def wan_quick(tmp_path_factory):
    """``python -m benchmarks wan --quick --json`` (parts 1–4): ``(doc, out)``."""
    out = tmp_path_factory.mktemp("bench-wan")
    return run_wan_benchmark(out, ["--quick"], WAN_TIMEOUT_S), out
