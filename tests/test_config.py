"""`aurora_store.config`: the environment is read here and nowhere else in the library; flags override it."""

from __future__ import annotations

import pytest

from aurora_store.config import HEARTBEAT_TTL_S, TransferSettings, heartbeat_ttl_s
from aurora_store.errors import ConfigError


def test_a_flag_overrides_the_environment_and_an_absent_flag_keeps_it(monkeypatch):
    monkeypatch.setenv("AURORA_STREAMS", "6")
    monkeypatch.setenv("AURORA_RETRIES", "2")
    env = TransferSettings.from_env()
    assert (env.streams, env.retries) == (6, 2)
    assert env.with_overrides(streams=None) == env
    flagged = env.with_overrides(streams=16, read_timeout_s=5.0)
    assert (flagged.streams, flagged.retries, flagged.read_timeout_s) == (16, 2, 5.0)
    with pytest.raises(ConfigError):
        env.with_overrides(streams=0)


def test_the_heartbeat_ttl_comes_from_the_environment_only_when_asked(monkeypatch, redis_url):
    from aurora_store.bus import ControlPlane

    monkeypatch.setenv("AURORA_HEARTBEAT_TTL", "3")
    assert heartbeat_ttl_s() == 3
    # the library's client takes the value it is given; it does not read the environment itself
    assert ControlPlane(redis_url, "r").heartbeat_ttl_s == HEARTBEAT_TTL_S
    assert ControlPlane(redis_url, "r", heartbeat_ttl_s=heartbeat_ttl_s()).heartbeat_ttl_s == 3
    monkeypatch.setenv("AURORA_HEARTBEAT_TTL", "1")
    with pytest.raises(ConfigError):
        heartbeat_ttl_s()
