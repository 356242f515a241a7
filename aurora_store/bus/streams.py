"""Thin, typed helpers over Redis Streams.

Stream entries carry flat string fields; payloads that need structure are JSON in one field. Streams are
trimmed with ``MAXLEN ~`` — consumers never rely on an entry still being there: Redis notifies, the
bucket (and the trainer's ledger) hold the truth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis

from aurora_store.bus.client import BLOCK_MS
from aurora_store.codec import jsondoc
from aurora_store.errors import MessageError

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT, KeyT, StreamIdT

DEFAULT_MAXLEN = 10_000


@dataclass(frozen=True)
class Entry:
    stream: str
    id: str
    fields: Mapping[str, str]

    @property
    def millis(self) -> int:
        """Server time (ms) at which the entry was added: part of every stream id."""
        return int(self.id.split("-", 1)[0])

    def json(self, field: str = "data") -> Any:
        return jsondoc.loads(self.fields[field], what=f"{self.stream} entry {self.id}", error=MessageError)


def decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(stream: str, raw_id: Any, raw_fields: Mapping[Any, Any] | None) -> Entry:
    fields = {decode(k): decode(v) for k, v in (raw_fields or {}).items()}
    return Entry(stream, decode(raw_id), fields)


def redis_fields(fields: Mapping[str, EncodableT]) -> dict[FieldT, EncodableT]:
    """``fields`` as redis-py's field-mapping parameters (``hset(mapping=)``, ``xadd``) are typed: those are keyed
    by ``FieldT`` (``str | bytes | …``) and invariant in the key, so a ``dict[str, str]`` does not type-check as
    one although redis-py accepts it. A copy with the wider key type."""
    return {k: v for k, v in fields.items()}


def _reply(reply: Any) -> list[list[Any]] | None:
    """An XREAD/XREADGROUP reply in the shape our clients get: ``[[stream, [(id, fields), ...]], ...]`` (or
    ``None``). redis-py types the reply as that or RESP3's dict shape; :func:`~aurora_store.bus.client.connect`
    keeps redis-py's default legacy (RESP2-shaped) responses, so it is always the list."""
    return cast("list[list[Any]] | None", reply)


def encode(fields: Mapping[str, Any]) -> dict[FieldT, EncodableT]:
    """Stream fields as Redis takes them: scalars as they are, anything structured as JSON."""
    return {k: v if isinstance(v, (str, bytes, int, float)) else json.dumps(v) for k, v in fields.items()}


def add(client: redis.Redis, stream: str, fields: Mapping[str, Any], *, maxlen: int = DEFAULT_MAXLEN) -> str:
    return decode(client.xadd(stream, encode(fields), maxlen=maxlen, approximate=True))


def read(client: redis.Redis, streams: Mapping[str, str], *, block_ms: int | None = BLOCK_MS,
         count: int = 100) -> list[Entry]:
    """XREAD after the given ids (``"$"`` = only new, ``"0"`` = from the start); blocks up to ``block_ms``.

    ``block_ms`` of ``None`` or ``0`` returns at once (Redis itself reads ``BLOCK 0`` as "forever", which would
    outlive the socket timeout)."""
    ids: dict[KeyT, StreamIdT] = {k: v for k, v in streams.items()}
    reply = _reply(client.xread(ids, count=count, block=block_ms or None))
    out: list[Entry] = []
    for stream, entries in reply or ():
        name = decode(stream)
        out.extend(_entry(name, eid, fields) for eid, fields in entries)
    return out


def read_range(client: redis.Redis, stream: str, *, count: int) -> list[Entry]:
    """The oldest ``count`` entries of ``stream`` (XRANGE), in order."""
    return [_entry(stream, raw_id, raw_fields) for raw_id, raw_fields in client.xrange(stream, count=count) or []]


def ensure_group(client: redis.Redis, stream: str, group: str, start: str = "0") -> None:
    """Create a consumer group (and the stream) if missing; idempotent."""
    try:
        client.xgroup_create(stream, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


@dataclass(frozen=True)
class RawEntry:
    """A stream entry whose field values are still the bytes the server sent (see :func:`read_group_raw`)."""

    stream: str
    id: str
    fields: Mapping[str, bytes]

    @property
    def millis(self) -> int:
        return int(self.id.split("-", 1)[0])

    @property
    def size(self) -> int:
        """Bytes of all names and values: what the entry costs before anything is decoded."""
        return sum(len(k) + len(v) for k, v in self.fields.items())


def read_group_raw(client: redis.Redis, stream: str, group: str, consumer: str, *,
                   block_ms: int | None = BLOCK_MS, count: int = 100) -> list[RawEntry]:
    """XREADGROUP of new entries, re-creating the group if the server lost it (e.g. after a restart). Values
    are left as bytes: a reader that bounds what it parses by size checks the size first (decoding alone
    would copy a huge value once more)."""
    try:
        reply = _reply(client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms or None))
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        ensure_group(client, stream, group)
        reply = _reply(client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms or None))
    out = []
    for _, entries in reply or ():
        for eid, raw in entries:
            values = {decode(k): v if isinstance(v, bytes) else str(v).encode() for k, v in (raw or {}).items()}
            out.append(RawEntry(stream, decode(eid), values))
    return out


def ack(client: redis.Redis, stream: str, group: str, ids: Sequence[str]) -> None:
    if ids:
        client.xack(stream, group, *ids)


def server_millis(client: redis.Redis) -> int:
    """The server's clock (ms), the same clock that stamps stream ids — one clock for leases and arrivals."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
