"""Configuration read from the environment, in one place.

Everything tunable without code changes is here, with its default. Command-line flags override these
values; library code receives them as arguments and never reads the environment itself.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aurora_store.errors import ConfigError


def _int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


@dataclass(frozen=True)
class TransferSettings:
    """How bytes move between buckets."""

    streams: int = 4  # parallel transfer streams (AURORA_STREAMS)
    retries: int = 4  # semantic retries: digest mismatch, 409, 5xx (AURORA_RETRIES)
    retry_wait_s: float = 0.2  # first backoff interval, doubled each retry (AURORA_RETRY_WAIT)
    connect_timeout_s: float = 10.0  # AURORA_CONNECT_TIMEOUT
    read_timeout_s: float = 60.0  # AURORA_READ_TIMEOUT

    def __post_init__(self) -> None:
        if self.streams < 1 or self.retries < 0:
            raise ConfigError(f"transfer settings need streams >= 1 and retries >= 0, got streams={self.streams}, "
                              f"retries={self.retries}")

    def with_overrides(self, *, streams: int | None = None, retries: int | None = None,
                       retry_wait_s: float | None = None, connect_timeout_s: float | None = None,
                       read_timeout_s: float | None = None) -> TransferSettings:
        """These settings with each field that is given (not None) replaced: a command-line flag over the
        environment, ``TransferSettings.from_env().with_overrides(streams=args.streams)``."""
        given: dict[str, Any] = {"streams": streams, "retries": retries, "retry_wait_s": retry_wait_s,
                                 "connect_timeout_s": connect_timeout_s, "read_timeout_s": read_timeout_s}
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})

    @classmethod
    def from_env(cls) -> TransferSettings:
        return cls(
            streams=_int("AURORA_STREAMS", cls.streams, minimum=1),
            retries=_int("AURORA_RETRIES", cls.retries, minimum=0),
            retry_wait_s=_float("AURORA_RETRY_WAIT", cls.retry_wait_s),
            connect_timeout_s=_float("AURORA_CONNECT_TIMEOUT", cls.connect_timeout_s),
            read_timeout_s=_float("AURORA_READ_TIMEOUT", cls.read_timeout_s),
        )



def default_run_name() -> str:
    return os.environ.get("AURORA_RUN", "default")


#: Seconds a live state (actor, relay) survives without a heartbeat, unless AURORA_HEARTBEAT_TTL says otherwise.
HEARTBEAT_TTL_S = 10


def heartbeat_ttl_s() -> int:
    """Seconds a live state (actor, relay) survives without a heartbeat (AURORA_HEARTBEAT_TTL, default
    :data:`HEARTBEAT_TTL_S`). Heartbeats are sent every second; the TTL bounds how long a vanished process still
    looks alive. Read by the processes and handed to their :class:`~aurora_store.bus.ControlPlane`."""
    return _int("AURORA_HEARTBEAT_TTL", HEARTBEAT_TTL_S, minimum=2)


def stop_grace_s() -> float:
    """Seconds a process asked to stop (SIGTERM, SIGINT) has for its graceful path before it ends regardless
    (AURORA_STOP_GRACE_S, default 20: spot VMs and pods give 30-120 s between the notice and the kill)."""
    value = _float("AURORA_STOP_GRACE_S", 20.0)
    if not value > 0:
        raise ConfigError(f"AURORA_STOP_GRACE_S must be a positive number of seconds, got {value}")
    return value


#: Where ``make demo`` writes its home bucket, relative to the directory it was run from.
DEMO_BUCKET = Path("runs") / "demo" / "buckets" / "us-east"


@dataclass(frozen=True)
class InspectSettings:
    """What the notebook helpers (:mod:`aurora_store.ops.inspect`) open when not told otherwise."""

    bucket: str | None = None  # AURORA_BUCKET; None: the demo's home bucket, if one is found
    redis: str | None = None  # AURORA_REDIS: a live run log
    run: str | None = None  # AURORA_RUN
    run_log_file: str | None = None  # AURORA_RUNLOG: a JSON-lines run log

    @classmethod
    def from_env(cls) -> InspectSettings:
        def get(name: str) -> str | None:
            return os.environ.get(name) or None

        return cls(get("AURORA_BUCKET"), get("AURORA_REDIS"), get("AURORA_RUN"), get("AURORA_RUNLOG"))


def find_demo_bucket(start: Path | None = None) -> Path | None:
    """The demo's home bucket in ``start`` (default: the working directory) or the nearest parent holding one
    (a notebook runs from ``notebooks/``, the demo from the repository root)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / DEMO_BUCKET).is_dir():
            return folder / DEMO_BUCKET
    return None


@dataclass(frozen=True)
class CommandDefaults:
    """Defaults of command-line flags that may also come from the environment (a flag always wins)."""

    trainer_public_key: str | None = None  # AURORA_TRAINER_PUBLIC_KEY: verify manifests with it
    signing_key: str | None = None  # AURORA_SIGNING_KEY: sign manifests with it
    redis: str | None = None  # AURORA_REDIS
    run: str | None = None  # AURORA_RUN
    # AURORA_CACHE_TOKEN: the run's bearer secret for the relays' segment caches (relay serves, actors read);
    # from the environment rather than the command line, where other users of the host could read it.
    cache_token: str | None = None
    wandb_project: str = "aurora"  # WANDB_PROJECT: the Weights & Biases project of ``--wandb``
    # AURORA_ADMISSION_SECRET: the operator's secret actors prove registration with and the trainer checks
    # (aurora_store.bus.identity); from the environment only (the secret store puts it there), never a flag,
    # never a process's logged configuration.
    admission_secret: str | None = None

    @classmethod
    def from_env(cls) -> CommandDefaults:
        def get(name: str) -> str | None:
            return os.environ.get(name) or None

        return cls(get("AURORA_TRAINER_PUBLIC_KEY"), get("AURORA_SIGNING_KEY"), get("AURORA_REDIS"), get("AURORA_RUN"),
                   get("AURORA_CACHE_TOKEN"), get("WANDB_PROJECT") or "aurora", get("AURORA_ADMISSION_SECRET"))


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher (``torchrun``) tells each process it starts: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``.
    Without a launcher: one rank, no local rank."""

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None  # None: not started by a launcher

    @property
    def launched(self) -> bool:
        return self.local_rank is not None

    @classmethod
    def from_env(cls) -> LaunchEnv:
        local = os.environ.get("LOCAL_RANK")
        return cls(_int("RANK", 0), _int("WORLD_SIZE", 1, minimum=1), None if local is None else _int("LOCAL_RANK", 0))
