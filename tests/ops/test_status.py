"""``aurora status`` against a real Redis, with states written through the ControlPlane."""

from __future__ import annotations

import json

import pytest

from aurora_store.bus import ActorState, ControlPlane, RelayState, TrainerState
from aurora_store.cli import main
from aurora_store.ops.status import discover_runs, read_status
from aurora_store.testing.members import Member
from aurora_store.testing.servers import closed_port

RUN = "ops-status"


@pytest.fixture()
def plane(redis_url):
    plane = ControlPlane(redis_url, RUN)
    now = plane.now_ms()
    credentials = Member("us-east-1", RUN).credentials
    plane.register_actor(ActorState("us-east-1", "us-east", "torch", 7, "lthash128:" + "1" * 32, 8,
                                            1234.5, 3, "ready", now - 1500, "regional", 4096), credentials)
    plane.heartbeat_actor(ActorState("eu-west-1", "eu-west", "torch", 6, "lthash128:" + "2" * 32, None,
                                     987.0, 0, "starting", now, "source"), credentials)
    plane.heartbeat_relay(RelayState("eu-west", 7, 21, 3 << 20, 30, 10, now - 500))
    plane.set_trainer_state(TrainerState(8, "lthash128:" + "3" * 32, 8, "/tmp/bucket", "us-east", now,
                                         "running", 7))
    yield plane
    plane.close()


def test_prints_actors_relays_and_trainer(plane, redis_url, capsys):
    assert main(["status", "--redis", redis_url, "--run", RUN]) == 0
    out = capsys.readouterr().out
    assert f"run {RUN}" in out
    assert "trainer (us-east): version 8, committed 7, step 8, running" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("us-east-1", "eu-west"))}
    assert lines["us-east-1"][:8] == ["us-east-1", "us-east", "ready", "7", "8", "1,234", "3", "regional"]
    assert lines["eu-west-1"][:8] == ["eu-west-1", "eu-west", "starting", "6", "-", "987", "0", "source"]
    relay = next(line for line in out.splitlines() if line.startswith("eu-west ")).split()
    assert relay[:6] == ["eu-west", "7", "21", "3.0", "MiB", "75.0%"]


def test_json_is_parseable_and_complete(plane, redis_url, capsys):
    assert main(["status", "--redis", redis_url, "--run", RUN, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"] == RUN and doc["trainer"]["version"] == 8 and doc["trainer"]["committed"] == 7
    actors = {a["actor_id"]: a for a in doc["actors"]}
    assert actors["us-east-1"]["staged"] == 8 and actors["us-east-1"]["leases"] == 3
    assert 1.0 <= actors["us-east-1"]["heartbeat_age_s"] < 30
    assert actors["eu-west-1"]["source"] == "source" and actors["eu-west-1"]["staged"] is None
    assert doc["relays"] == [{"region": "eu-west", "version": 7, "segments_copied": 21, "bytes_copied": 3 << 20,
                              "cache_hit_ratio": 0.75, "heartbeat_age_s": doc["relays"][0]["heartbeat_age_s"]}]


def test_watch_refreshes_and_the_run_is_found_without_run(plane, redis_url, capsys):
    assert discover_runs(redis_url) == [RUN]
    assert main(["status", "--redis", redis_url, "--watch", "--interval", "0.05", "--count", "3", "--json"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 3 and all(d["run"] == RUN for d in docs)
    assert docs[0]["now_ms"] <= docs[-1]["now_ms"]


def test_reads_the_same_through_the_library(plane):
    status = read_status(plane)
    assert [a.actor_id for a in status.actors] == ["eu-west-1", "us-east-1"]  # by region, then id
    assert status.trainer is not None and status.trainer.step == 8


def test_errors_exit_2(redis_url, capsys, monkeypatch):
    monkeypatch.delenv("AURORA_REDIS", raising=False)
    assert main(["status"]) == 2
    assert "--redis" in capsys.readouterr().err
    assert main(["status", "--redis", redis_url]) == 2  # flushed: no run at all
    assert "no Aurora run" in capsys.readouterr().err
    with closed_port() as port:
        assert main(["status", "--redis", f"redis://127.0.0.1:{port}/0", "--run", RUN]) == 2
    assert "cannot reach" in capsys.readouterr().err
