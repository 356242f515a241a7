"""Control-plane messages: version events, live states, leases and results.

Events carry references only (version, manifest key, digest): no receiver acts on an event alone — it
reads and verifies the manifest in its bucket. Every message converts to flat stream fields and back;
malformed input raises :class:`MessageError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from aurora_store.codec import jsondoc
from aurora_store.errors import MessageError


def _coerce(cls, raw: Mapping[str, str]):
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise MessageError(f"{cls.__name__}: missing field {f.name!r}")
        value = raw[f.name]
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        try:
            if value == "" and "None" in kind:
                kwargs[f.name] = None
            elif kind.startswith("int"):
                kwargs[f.name] = int(value)
            elif kind.startswith("float"):
                kwargs[f.name] = float(value)
                if not math.isfinite(kwargs[f.name]):
                    raise ValueError("not a finite number")
            elif kind.startswith("bool"):
                kwargs[f.name] = value in ("1", "true", "True")
            elif kind.startswith(("dict", "list", "Mapping")):
                kwargs[f.name] = (jsondoc.loads(value, what=f"{cls.__name__}.{f.name}", error=MessageError)
                                  if isinstance(value, str) else value)
            else:
                kwargs[f.name] = value
        except (TypeError, ValueError) as exc:
            raise MessageError(f"{cls.__name__}.{f.name}: bad value {value!r}") from exc
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise MessageError(f"{cls.__name__}: {exc}") from exc


def _fields(obj) -> dict[str, str]:
    out = {}
    # A shallow walk, not dataclasses.asdict: asdict deep-copies every value, and a step's dispatch converts
    # thousands of leases (the values here are scalars, or JSON-ready lists/dicts dumped below anyway).
    for key, value in ((f.name, getattr(obj, f.name)) for f in fields(obj)):
        if value is None:
            out[key] = ""
        elif isinstance(value, bool):
            out[key] = "1" if value else "0"
        elif isinstance(value, (dict, list)):
            out[key] = json.dumps(value, separators=(",", ":"))
        else:
            out[key] = str(value)
    return out


class _Message:
    def to_fields(self) -> dict[str, str]:
        return _fields(self)

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]):
        return _coerce(cls, raw)


@dataclass(frozen=True)
class VersionEvent(_Message):
    """``segment`` (one segment durable), ``staged`` (manifest durable), ``commit`` (activate at the next batch
    boundary), ``snapshot`` (a snapshot is durable)."""

    KINDS: ClassVar[tuple[str, ...]] = ("segment", "staged", "commit", "snapshot")
    kind: str
    version: int
    region: str
    base: int | None = None
    manifest_key: str | None = None
    weights_digest: str | None = None
    segment: str | None = None  # SHA-256 of the segment (kind == "segment")
    size: int | None = None
    sent_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise MessageError(f"unknown version event kind {self.kind!r}")
        if self.version < 0:
            raise MessageError("negative version")


@dataclass(frozen=True)
class ActorState(_Message):
    actor_id: str
    region: str
    engine: str
    active_version: int | None
    active_digest: str | None
    staged_version: int | None
    tokens_per_s: float
    leases: int
    status: str  # "starting" | "ready" | "leaving"
    heartbeat_ms: int
    source: str  # which bucket it reads: "regional" or "source"
    downloaded_bytes: int = 0
    host: str = ""
    staging_version: int | None = None  # the version being fetched/decoded right now


@dataclass(frozen=True)
class RelayState(_Message):
    region: str
    version: int | None
    segments_copied: int
    bytes_copied: int
    cache_hits: int
    cache_misses: int
    heartbeat_ms: int
    cache_url: str | None = None  # where the region's actors read segments from its hot cache; None: not served


@dataclass(frozen=True)
class TrainerState(_Message):
    version: int
    weights_digest: str
    step: int
    bucket: str
    region: str
    heartbeat_ms: int
    status: str = "running"
    committed: int = -1  # newest version actors were told to activate


@dataclass(frozen=True)
class Lease(_Message):
    """One prompt handed to one actor, to be generated on ``version`` and returned before ``expires_ms``
    (server clock)."""

    lease_id: str
    prompt_id: str
    step: int
    version: int
    weights_digest: str
    expires_ms: int
    prompt: str
    group_size: int
    max_new_tokens: int
    temperature: float = 1.0


@dataclass(frozen=True)
class RolloutResult(_Message):
    """What an actor returns for a lease; version and digest are stamped when generation was dispatched."""

    kind: str  # "result" or "return" (a lease handed back unfinished)
    lease_id: str
    actor_id: str
    token: str
    version: int | None = None
    weights_digest: str | None = None
    tokens: int = 0
    gen_seconds: float = 0.0
    samples: list = field(default_factory=list)  # [{"ids": [...], "logprobs": [...], "text": "..."}]

    def __post_init__(self) -> None:
        if self.kind not in ("result", "return"):
            raise MessageError(f"unknown result kind {self.kind!r}")


def as_dict(message: Any) -> dict[str, Any]:
    return asdict(message)
