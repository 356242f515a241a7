"""Run-log exports (real Redis → a real bucket) and the run-log views the notebook draws."""

from __future__ import annotations

import datetime as dt

import pytest

from aurora_store.bus import ControlPlane
from aurora_store.errors import FormatError
from aurora_store.ops import inspect, plots
from aurora_store.ops.notebook import figure
from aurora_store.ops.runlog import PREFIX, decode_entries, export_run_log, load_exported
from aurora_store.store import DeltaStore
from aurora_store.testing.servers import closed_port
from tests.ops.helpers import build_bucket


def test_exports_merge_by_entry_id(redis_url, tmp_path):
    plane = ControlPlane(redis_url, "ops-runlog")
    store = DeltaStore(str(tmp_path / "bucket"), create=True)
    assert export_run_log(plane, store) is None  # nothing logged yet: nothing written
    plane.log_event("activate", actor="a-1", region="us-east", version=1, digest="d1", seconds=0.01)
    first = export_run_log(plane, store, now=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    plane.log_event("settle", step=1, actor="a-1", version=1, accepted=0, reason="wrong_digest")
    second = export_run_log(plane, store)
    assert first == f"{PREFIX}20260101T000000.000000Z.jsonl" and second.startswith(PREFIX) and first != second
    entries = load_exported(store)
    assert entries == plane.run_log()  # the second export repeats the first entry: merged, not duplicated
    assert [e["kind"] for e in entries] == ["activate", "settle"] and entries[1]["accepted"] == "0"
    plane.close()


def test_malformed_exports_are_format_errors():
    with pytest.raises(FormatError, match="line 2"):
        decode_entries(b'{"id": "1-0", "kind": "step"}\nnot json\n')
    with pytest.raises(FormatError, match="no 'id'"):
        decode_entries(b'{"kind": "step"}\n')


def test_settlements_and_timeline_from_a_log():
    log = [{"id": "1000-0", "kind": "actor_bootstrap", "actor": "a", "version": "0"},
           {"id": "1500-0", "kind": "settle", "actor": "a", "accepted": "1", "reason": "ok"},
           {"id": "1600-0", "kind": "settle", "actor": "b", "accepted": "0", "reason": "expired"},
           {"id": "1700-0", "kind": "settle", "actor": "", "accepted": "0", "reason": "malformed"},
           {"id": "3000-0", "kind": "activate", "actor": "a", "version": "1"}]
    counts = inspect.settlements(log)
    assert counts.per_actor == {"(unknown)": (0, 1), "a": (1, 0), "b": (0, 1)}
    assert counts.reasons == {"expired": 1, "malformed": 1} and counts.total == 3
    assert inspect.actor_timeline(log) == {"a": [(0.0, 0), (2.0, 1)]}
    fig, (left, right) = figure(cols=2)
    plots.settlements(left, counts)
    plots.rejection_reasons(right, counts)
    plots.actor_versions(left, inspect.actor_timeline(log))
    fig.canvas.draw()
    assert inspect.actor_timeline([]) == {} and inspect.settlements([]).total == 0


def test_the_notebook_view_reads_redis_first_and_falls_back_to_exports(redis_url, tmp_path):
    run = build_bucket(str(tmp_path / "bucket"), versions=2, snapshots=(0,))  # run.json names run "ops-test"
    plane = ControlPlane(redis_url, "ops-test")
    plane.log_event("relay_forward", region="eu-west", version=1, bytes=10, segments=1)
    view = inspect.open_view(run.store.url, redis=redis_url)
    assert view.run_log_source == "redis run ops-test" and [e["kind"] for e in view.run_log] == ["relay_forward"]
    [latency] = inspect.latencies(view.run_log, view.versions, "relay_forward")
    assert latency.who == "eu-west" and latency.version == 1
    export_run_log(plane, run.store)
    plane.close()
    with closed_port() as port:
        view = inspect.open_view(run.store.url, redis=f"redis://127.0.0.1:{port}/0")
    assert view.run_log_source == f"{run.store.url}/{PREFIX}" and len(view.run_log) == 1
