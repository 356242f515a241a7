"""Once the process is stopping (:mod:`aurora_store.shutdown`), the control plane stops retrying towards a Redis
that is down — a real Valkey, stopped — while a healthy one is still used (a graceful leave needs it)."""

from __future__ import annotations

import threading
import time

import pytest

from aurora_store import shutdown
from aurora_store.bus import ControlPlane, connect
from aurora_store.errors import BusError
from aurora_store.testing.servers import RedisServer, closed_port

pytestmark = pytest.mark.redis


@pytest.fixture(autouse=True)
def _no_request_left_behind():
    shutdown.reset()
    yield
    shutdown.reset()


def _request_in(seconds: float) -> None:
    threading.Timer(seconds, shutdown.request, args=("SIGTERM",)).start()


def test_a_call_retrying_towards_a_redis_that_is_down_gives_up_once_a_stop_is_requested():
    with RedisServer().start() as server:
        plane = ControlPlane(server.url, "r")
        server.stop()
        _request_in(0.5)
        started = time.monotonic()
        with pytest.raises(BusError, match="not retried: stopping on SIGTERM"):
            plane.actors()  # would retry for a minute
        assert 0.4 < time.monotonic() - started < 2.0
        plane.close()


def test_a_stopping_process_still_uses_a_healthy_redis(redis_url):
    plane = ControlPlane(redis_url, "r")
    shutdown.request("SIGTERM")
    plane.log_event("actor_leave", actor="a1")
    assert plane.run_log()[-1]["kind"] == "actor_leave"
    plane.close()


def test_connecting_gives_up_once_a_stop_is_requested():
    _request_in(0.5)
    started = time.monotonic()
    with closed_port() as port, pytest.raises(BusError, match="not retried"):
        connect(f"redis://127.0.0.1:{port}/0", wait_s=60)
    assert time.monotonic() - started < 2.0


def test_sleep_ends_at_a_request():
    _request_in(0.2)
    started = time.monotonic()
    assert shutdown.sleep(30) is True
    assert time.monotonic() - started < 1.0
    assert shutdown.requested() == "SIGTERM"
