"""Object names inside a bucket (documented in docs/FORMAT.md)."""

from __future__ import annotations

import re

from aurora_store.errors import ConfigError

VERSION_DIGITS = 12
RUN_INFO = "run.json"
DELTAS = "deltas/"
SEGMENTS = "segments/"
SNAPSHOTS = "snapshots/"
LAYOUTS = "layouts/"
HISTORY = "history/"
SNAPSHOT_MANIFEST = "manifest.json"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DELTA_KEY = re.compile(rf"^deltas/(\d{{{VERSION_DIGITS}}})\.json$")
_SNAPSHOT_KEY = re.compile(rf"^snapshots/(\d{{{VERSION_DIGITS}}})/manifest\.json$")


def padded(version: int) -> str:
    if not 0 <= version < 10**VERSION_DIGITS:
        raise ConfigError(f"version {version} out of range")
    return f"{version:0{VERSION_DIGITS}d}"


def segment(digest: str) -> str:
    if not _SHA256.match(digest):
        raise ConfigError(f"not a SHA-256 hex digest: {digest!r}")
    return f"{SEGMENTS}{digest[:2]}/{digest}"


def delta(version: int) -> str:
    return f"{DELTAS}{padded(version)}.json"


def snapshot_dir(version: int) -> str:
    return f"{SNAPSHOTS}{padded(version)}/"


def snapshot_manifest(version: int) -> str:
    return snapshot_dir(version) + SNAPSHOT_MANIFEST


def layout(fingerprint: str) -> str:
    return f"{LAYOUTS}{fingerprint.removeprefix('sha256:')}.json"


def history(version: int) -> str:
    return f"{HISTORY}{padded(version)}.parquet"


def delta_version(key: str) -> int | None:
    match = _DELTA_KEY.match(key)
    return int(match.group(1)) if match else None


def snapshot_version(key: str) -> int | None:
    match = _SNAPSHOT_KEY.match(key)
    return int(match.group(1)) if match else None


def segment_digest(key: str) -> str | None:
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "segments" and _SHA256.match(parts[2]) and parts[1] == parts[2][:2]:
        return parts[2]
    return None
