"""Keeping the run log: Redis is ephemeral, the bucket is not.

The trainer, actors and relays append operator events to a Redis stream (``ControlPlane.log_event``:
``activate``, ``settle``, ``relay_forward``, ``step``, …). Redis may lose it at any time, so the trainer
exports it into the bucket as JSON lines under ``runlog/<UTC time>.jsonl`` — one object per entry, the
stream entry ``id`` (``<server ms>-<seq>``) plus the entry's fields, all strings as Redis stores them.

Readers merge every export by entry id, so exporting repeatedly (e.g. at the end of each run, or
periodically) never duplicates entries; entries trimmed from Redis before an export stay in older exports.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from aurora_store.bus import ControlPlane
from aurora_store.codec import jsondoc
from aurora_store.errors import FormatError
from aurora_store.store.versions import DeltaStore

PREFIX = "runlog/"


def export_run_log(plane: ControlPlane, store: DeltaStore, *, now: dt.datetime | None = None) -> str | None:
    """Write the run log now in Redis to ``runlog/<timestamp>.jsonl`` in ``store``; returns the key, or
    ``None`` when the log is empty (nothing is written)."""
    entries = plane.run_log()
    if not entries:
        return None
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%dT%H%M%S.%fZ")
    key = f"{PREFIX}{stamp}.jsonl"
    store.put_object(key, encode_entries(entries))
    return key


def encode_entries(entries: Iterable[Mapping[str, str]]) -> bytes:
    return "".join(json.dumps(dict(e), sort_keys=True, ensure_ascii=False) + "\n" for e in entries).encode()


def decode_entries(data: bytes, source: str = "run log") -> list[dict[str, str]]:
    out = []
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise FormatError(f"{source} is not UTF-8: {exc}") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        entry = jsondoc.loads(line, what=f"{source} line {n}", error=FormatError)
        if not isinstance(entry, dict) or "id" not in entry:
            raise FormatError(f"{source} line {n} is not a run-log entry (no 'id')")
        out.append({str(k): str(v) for k, v in entry.items()})
    return out


def load_exported(store: DeltaStore) -> list[dict[str, str]]:
    """Every entry of every export in ``store``, merged by entry id and in stream order ([] if none)."""
    merged: dict[str, dict[str, str]] = {}
    for key in store.list_objects(PREFIX):
        if key.endswith(".jsonl"):
            for entry in decode_entries(store.get_object(key), f"{store.url}/{key}"):
                merged[entry["id"]] = entry
    return sorted(merged.values(), key=lambda e: entry_order(e["id"]))


def load_file(path: str | Path) -> list[dict[str, str]]:
    """A JSON-lines export saved anywhere (e.g. copied out of a bucket)."""
    return decode_entries(Path(path).read_bytes(), str(path))


def load_redis(redis_url: str, run: str, *, wait_s: float = 1.0) -> list[dict[str, str]]:
    plane = ControlPlane(redis_url, run, wait_s=wait_s)
    try:
        return plane.run_log()
    finally:
        plane.close()


def entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def entry_millis(entry_id: str) -> int:
    """The Redis server time (ms since the epoch) at which the entry was appended."""
    return entry_order(entry_id)[0]
