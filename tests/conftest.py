"""Shared test configuration: hypothesis profiles and real servers (Redis/Valkey, SeaweedFS S3, a GCS
emulator, Azurite)."""

from __future__ import annotations

import os

# One torch / OpenMP thread per process, in this process and in every process it starts (set before anything
# imports torch): the suite runs its own work beside servers, clusters and engines on a 2-core machine, where a
# second OpenMP thread per process mostly spins. Measured: a 30-step chaos run 139 → 46 CPU-s; in-process
# training tests 37 → 31 CPU-s. Set OMP_NUM_THREADS yourself to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import secrets
import uuid

import pytest
from hypothesis import HealthCheck, settings

from aurora_store.errors import ConfigError
from aurora_store.testing.servers import (
    AzuriteServer,
    GCSServer,
    RedisServer,
    S3Server,
    azurite_binary,
    environment,
)
from workers.launch import start_from_template

pytest_plugins = ["tests.cpu_time", "tests.parallel"]  # parallel: how `make test` spreads the suite

# The operator's admission secret, for every trainer and actor a test starts (in-process or as a child).
os.environ.setdefault("AURORA_ADMISSION_SECRET", secrets.token_urlsafe(24))

# The local clusters' trainers, actors and relays start from one warm template process (workers.forkserver): the
# suite starts ~150 of them, each of which would first pay 2-6 CPU-seconds of imports on two cores.
# AURORA_TEST_FRESH_INTERPRETERS=1 starts every one the usual way.
start_from_template(os.environ.get("AURORA_TEST_FRESH_INTERPRETERS") != "1")

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: A test that uses one of these fixtures needs that server: it gets the marker, so ``-m "not s3"`` really
#: deselects every test that would start SeaweedFS (modules that start servers themselves mark it too).
_SERVER_MARKERS = {"s3_server": "s3", "gcs_server": "gcs", "redis_server": "redis", "azure_server": "azure"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in _SERVER_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (SeaweedFS) for the whole session; clients get its credentials."""
    server = S3Server().start()
    with environment(server.env()):
        yield server
    server.stop()


@pytest.fixture()
def s3_bucket_url(s3_server):
    """A fresh, empty bucket on the S3 server."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return s3_server.bucket_url(name)


@pytest.fixture(scope="session")
def gcs_server():
    """A GCS emulator (gcp-storage-emulator) for the whole session. Its URLs carry the endpoint and
    ``token=anon``, so nothing is set in the environment."""
    server = GCSServer().start()
    yield server
    server.stop()


@pytest.fixture()
def gcs_bucket_url(gcs_server):
    """A fresh, empty bucket on the GCS emulator."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    return gcs_server.bucket_url(name)


@pytest.fixture(scope="session")
def azure_server():
    """Azurite (Azure Blob Storage emulator) for the whole session; clients get its connection string through
    the environment, as adlfs reads it. Skipped, visibly, where ``make node-deps`` could not install it (no npm)."""
    try:
        azurite_binary()
    except ConfigError as exc:
        pytest.skip(str(exc))
    server = AzuriteServer().start()
    with environment(server.env()):
        yield server
    server.stop()


@pytest.fixture()
def azure_bucket_url(azure_server):
    """A fresh, empty container on Azurite."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    azure_server.create_bucket(name)
    return azure_server.bucket_url(name)


@pytest.fixture(scope="session")
def redis_server():
    """Valkey with the per-role ACL users (``redis_server.url_for("actor")``); ``url`` is the operator's."""
    from aurora_store.bus import acl

    server = RedisServer(acl_users={role: secrets.token_hex(16) for role in acl.ROLES}).start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(redis_server):
    """The session Redis, flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url
