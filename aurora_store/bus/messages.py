"""Control-plane messages: version events, live states, leases and results.

Events carry references only (version, manifest key, digest): no receiver acts on an event alone — it
reads and verifies the manifest in its bucket. Every message converts to flat stream fields and back;
malformed input raises :class:`MessageError`.

Anyone holding the Redis URL can write any stream, so this is the one gate every message passes where it is
parsed: each field's raw text is held to a length cap *before* it is parsed (``LIMITS``: what the field can
legitimately carry), then typed, then range-checked (``__post_init__``, with the ``check_*`` helpers). A kind
outside ``KINDS`` raises :class:`UnknownKindError`, so readers can count it apart from malformed input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from aurora_store.codec import jsondoc
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import FormatError, MessageError

#: Largest version any message may name: the largest a bucket's object names spell (12 digits,
#: ``store.object_names.VERSION_DIGITS``) — far beyond any run, and exact in every JSON reader.
MAX_VERSION = 10**12 - 1
#: Largest segment a ``segment`` event may announce: the codec's largest target (1 GiB) plus one chunk's slack.
MAX_SEGMENT_BYTES = 1 << 31
#: Stream timestamps (ms): up to the year 2255.
MAX_MILLIS = 1 << 43
#: Raw length cap of a field no ``LIMITS`` entry names: numbers are short, and free text is the exception.
INT_CHARS = 24
FLOAT_CHARS = 32

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_OBJECT_KEY = re.compile(r"[A-Za-z0-9._/-]{1,256}")


class UnknownKindError(MessageError):
    """A message names a kind its reader does not know: dropped and counted, like malformed input."""


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _limit(cls, name: str, kind: str) -> int | None:
    limits: Mapping[str, int] = getattr(cls, "LIMITS", {})
    if name in limits:
        return limits[name]
    if kind.startswith("int"):
        return INT_CHARS
    if kind.startswith("float"):
        return FLOAT_CHARS
    return None

# --- bounds of the membership messages (registration, actor state, lease, result) ---------------------------
# Everything an actor sends is checked here, where it is parsed: an ill-typed or out-of-range field makes the
# whole message malformed (counted and dropped by the reader), never an exception in the trainer's loop.
ACTOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
LEASE_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, as the ledger makes them
MAX_TEXT = 256  # short free-text fields (region, engine, host, digest, status)
MAX_GROUP = 1024  # samples per prompt
MAX_NEW_TOKENS = 1 << 17
MAX_RATE = 1e9  # tokens/s a report may claim (finite and non-absurd; the trainer measures anyway)
#: Bytes of a result's stream fields besides its samples (ids, digest, signature, numbers).
RESULT_OVERHEAD = 2048
#: Bytes one completion token may take in a result's samples JSON: its id, its logprob (repr of a float),
#: its share of the decoded text, separators. The cap of a result is derived from its lease with this.
BYTES_PER_TOKEN = 64
BYTES_PER_SAMPLE = 128


def result_cap(group_size: int, max_new_tokens: int) -> int:
    """The most bytes a result for a lease of ``group_size`` × ``max_new_tokens`` can legitimately take."""
    return RESULT_OVERHEAD + group_size * (BYTES_PER_SAMPLE + BYTES_PER_TOKEN * max_new_tokens)


def _check_id(what: str, value: object, pattern: re.Pattern[str], *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise MessageError(f"{what}: not a valid id: {str(value)[:80]!r}")


def _check_text(what: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise MessageError(f"{what}: expected a string of at most {MAX_TEXT} characters")


def _check_int(what: str, value: object, low: int, high: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MessageError(f"{what}: expected an integer in [{low}, {high}], got {str(value)[:40]!r}")


def _check_float(what: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                              and low <= value <= high):
        raise MessageError(f"{what}: expected a finite number in [{low}, {high}], got {str(value)[:40]!r}")


def _coerce(cls, raw: Mapping[str, str]):
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise MessageError(f"{cls.__name__}: missing field {f.name!r}")
        value = raw[f.name]
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        limit = _limit(cls, f.name, kind)
        if limit is not None and isinstance(value, (str, bytes)) and len(value) > limit:
            # before any parsing: a many-megabyte field costs its reader nothing beyond this length check
            raise MessageError(f"{cls.__name__}.{f.name}: {len(value)} characters, more than the {limit} "
                               f"it can carry")
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
    except MessageError:
        raise  # already says what is wrong (and its type: an unknown kind is counted apart)
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
    #: Raw length cap (characters) per field, checked before parsing; fields not named get the defaults above
    #: (numbers) or none (free text and JSON: a message class with such fields names their caps here).
    LIMITS: ClassVar[Mapping[str, int]] = {}

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
    LIMITS: ClassVar[Mapping[str, int]] = {"kind": 16, "region": 64, "manifest_key": 256, "weights_digest": 64,
                                           "segment": 64}
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
            raise UnknownKindError(f"unknown version event kind {self.kind[:16]!r}")
        owner = f"VersionEvent({self.kind})"
        _check_int(f"{owner}.version", self.version, 0, MAX_VERSION)
        _check_int(f"{owner}.base", self.base, 0, MAX_VERSION, optional=True)
        _check_id(f"{owner}.region", self.region, _NAME)
        _check_id(f"{owner}.manifest_key", self.manifest_key, _OBJECT_KEY, optional=True)
        if self.manifest_key is not None and ".." in self.manifest_key.split("/"):
            raise MessageError(f"{owner}.manifest_key: {self.manifest_key[:80]!r} climbs out of the run")
        if self.weights_digest is not None:
            _check_weights_digest(owner, self.weights_digest)
        # a SHA-256 in the one spelling names use (it becomes an object or file name)
        _check_id(f"{owner}.segment", self.segment, _SHA256, optional=True)
        _check_int(f"{owner}.size", self.size, 1, MAX_SEGMENT_BYTES, optional=True)
        _check_int(f"{owner}.sent_ms", self.sent_ms, 0, MAX_MILLIS, optional=True)
        if self.kind == "segment" and (self.segment is None or self.size is None):
            raise MessageError(f"{owner}: a segment event names its segment and size")


def _check_weights_digest(owner: str, value: str) -> None:
    try:
        WeightsDigest.parse(value)
    except FormatError as exc:
        raise MessageError(f"{owner}.weights_digest: {exc}") from None


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

    STATUSES: ClassVar[tuple[str, ...]] = ("starting", "ready", "leaving")

    def __post_init__(self) -> None:
        _check_id("ActorState.actor_id", self.actor_id, ACTOR_ID)
        for name in ("region", "engine", "source", "host"):
            _check_text(f"ActorState.{name}", getattr(self, name))
        _check_text("ActorState.active_digest", self.active_digest, optional=True)
        for name in ("active_version", "staged_version", "staging_version"):
            _check_int(f"ActorState.{name}", getattr(self, name), 0, MAX_VERSION, optional=True)
        _check_float("ActorState.tokens_per_s", self.tokens_per_s, 0.0, MAX_RATE)
        _check_int("ActorState.leases", self.leases, 0, 1 << 31)
        _check_int("ActorState.heartbeat_ms", self.heartbeat_ms, 0, 1 << 62)
        _check_int("ActorState.downloaded_bytes", self.downloaded_bytes, 0, 1 << 62)
        if self.status not in self.STATUSES:
            raise MessageError(f"ActorState.status: unknown status {self.status[:40]!r}")


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

    def __post_init__(self) -> None:
        _check_id("Lease.lease_id", self.lease_id, LEASE_ID)
        _check_text("Lease.prompt_id", self.prompt_id)
        _check_text("Lease.weights_digest", self.weights_digest)
        _check_int("Lease.step", self.step, 0, MAX_VERSION)
        _check_int("Lease.version", self.version, 0, MAX_VERSION)
        _check_int("Lease.expires_ms", self.expires_ms, 0, 1 << 62)
        _check_int("Lease.group_size", self.group_size, 1, MAX_GROUP)
        _check_int("Lease.max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        _check_float("Lease.temperature", self.temperature, 0.0, 100.0)
        if not isinstance(self.prompt, str):
            raise MessageError("Lease.prompt: expected a string")

    @property
    def result_cap(self) -> int:
        """The most bytes a result for this lease may take (checked before the result is parsed)."""
        return result_cap(self.group_size, self.max_new_tokens)


@dataclass(frozen=True)
class RolloutResult(_Message):
    """What an actor returns for a lease; version and digest are stamped when generation was dispatched.
    ``signature``: the actor's Ed25519 signature over every other field (:mod:`aurora_store.bus.identity`).
    The samples' shape is checked against the lease by the ledger, which alone knows the lease."""

    kind: str  # "result" or "return" (a lease handed back unfinished)
    lease_id: str
    actor_id: str
    signature: str
    version: int | None = None
    weights_digest: str | None = None
    tokens: int = 0
    gen_seconds: float = 0.0
    samples: list = field(default_factory=list)  # [{"ids": [...], "logprobs": [...], "text": "..."}]

    def __post_init__(self) -> None:
        if self.kind not in ("result", "return"):
            raise MessageError(f"unknown result kind {str(self.kind)[:40]!r}")
        _check_id("RolloutResult.lease_id", self.lease_id, LEASE_ID)
        _check_id("RolloutResult.actor_id", self.actor_id, ACTOR_ID)
        _check_text("RolloutResult.signature", self.signature)
        _check_text("RolloutResult.weights_digest", self.weights_digest, optional=True)
        _check_int("RolloutResult.version", self.version, 0, MAX_VERSION, optional=True)
        _check_int("RolloutResult.tokens", self.tokens, 0, 1 << 40)
        _check_float("RolloutResult.gen_seconds", self.gen_seconds, 0.0, 1e9)
        if not isinstance(self.samples, list):
            raise MessageError("RolloutResult.samples: expected a list")


def as_dict(message: Any) -> dict[str, Any]:
    return asdict(message)
