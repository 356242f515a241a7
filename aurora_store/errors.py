"""One error hierarchy for the whole package.

Every error Aurora raises on purpose derives from :class:`AuroraError`, and also from the builtin a
caller would naturally catch (``FileExistsError`` for a lost create race, ``FileNotFoundError`` for a
missing object, ``ValueError`` for malformed input, ``TypeError`` for an unsupported dtype). Callers can
therefore catch either the precise Aurora type or the builtin.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class AuroraError(Exception):
    """Root of every error raised deliberately by Aurora."""


# --- codec -----------------------------------------------------------------------------------------


class CodecError(AuroraError, ValueError):
    """Input to the delta codec is invalid."""


class UnsupportedDtypeError(AuroraError, TypeError):
    """A tensor's dtype cannot be encoded (only 16-bit floats are)."""


class LayoutError(CodecError):
    """A state dict or config does not match the model layout."""


class UnsupportedModelError(LayoutError):
    """The model's architecture has no layout (unknown, or known and refused for a stated reason)."""


class LayoutCoverageError(LayoutError):
    """A model and its layout do not cover each other: trainable parameters no layout tensor ships
    (``uncovered``), layout tensors the model does not hold (``unsourced``), or engine parameters the layout
    does not name (``unnamed``). The message names them."""

    def __init__(self, message: str, *, uncovered: Iterable[str] = (), unsourced: Iterable[str] = (),
                 unnamed: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.uncovered = tuple(uncovered)
        self.unsourced = tuple(unsourced)
        self.unnamed = tuple(unnamed)


class LayoutMismatchError(LayoutError):
    """The delta was produced for a different model layout (fingerprint mismatch)."""


class FormatError(CodecError):
    """Bytes or JSON do not follow the documented wire format."""


class CorruptSegmentError(FormatError):
    """A segment is truncated, malformed, or its content does not hash to its name."""


class ManifestError(FormatError):
    """A manifest is malformed or inconsistent with its segments."""


class SignatureError(ManifestError):
    """A manifest is unsigned, signed by another key, or its signature does not cover its content."""


class BaseVersionMismatchError(CodecError):
    """A delta's declared base version is not the target's active version."""


class DigestMismatchError(CodecError):
    """Weights after applying a delta would not match the manifest's ``weights_digest``."""


# --- store -----------------------------------------------------------------------------------------


class StoreError(AuroraError, OSError):
    """A bucket operation failed."""


class InvalidKeyError(StoreError, ValueError):
    """An object key is empty, absolute, or contains ``.``/``..`` parts."""


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object does not exist in the bucket."""


class VersionNotFoundError(ObjectNotFoundError):
    """No manifest exists for the requested version."""


class BucketNotFoundError(StoreError, FileNotFoundError):
    """The bucket (or local root directory) does not exist."""


class ObjectExistsError(StoreError, FileExistsError):
    """A create-only write found the object already present with different content."""


class VersionExistsError(ObjectExistsError):
    """Another writer published this version first."""


class StoreAuthError(StoreError, PermissionError):
    """The credentials were rejected by the bucket."""


class TransientStoreError(StoreError):
    """A retryable failure (5xx, timeout, conditional conflict) that outlived its retries."""


class CreateOnlyUnsupportedError(StoreError, NotImplementedError):
    """The bucket's filesystem has no atomic create-only write, so publishing there could let two writers both
    "win" a version; refused unless the operator declares a single writer (``?single_writer=true``)."""


class IntegrityError(StoreError):
    """Bytes fetched from a bucket do not match their content address, even after re-fetching."""


# --- control plane and scheduling -----------------------------------------------------------------


class BusError(AuroraError, ConnectionError):
    """The Redis control plane is unreachable or refused us."""


class BusAuthError(BusError, PermissionError):
    """Redis rejected the credentials or the TLS handshake."""


class MessageError(AuroraError, ValueError):
    """A control-plane message is malformed."""


class SchedulingError(AuroraError, ValueError):
    """A scheduling request is inconsistent (e.g. no eligible actors)."""


class NoEligibleActors(AuroraError, TimeoutError):
    """No actor became eligible for a step's work before the trainer's deadline."""


class RankAborted(AuroraError, RuntimeError):
    """Another rank (rank 0) failed an operation all ranks take part in; this rank stops too."""


class EngineError(AuroraError, RuntimeError):
    """An inference engine failed or refused an operation (its weights' state is then unknown)."""


class ConfigError(AuroraError, ValueError):
    """Configuration is missing or invalid."""


class InsufficientMemoryError(ConfigError, MemoryError):
    """The trainer's memory plan does not fit the device it would run on (refused before allocating)."""


class DiskBudgetError(AuroraError, OSError):
    """A directory's filesystem cannot hold what a process will write there (e.g. the trainer's checkpoints);
    ``needed`` and ``free`` are in bytes."""

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free


class MetricsPortError(AuroraError, OSError):
    """A process cannot serve its Prometheus metrics where told (``--metrics-port``): the port is taken, or
    the address is not this host's; raised at start, before the process takes part in the run."""


# --- operations and local services ----------------------------------------------------------------


class _ReportedProblem(Protocol):
    """What :class:`GcRefusedError` carries: an ``aurora_store.ops.problems.Problem`` (named structurally:
    errors sit below ops in the layering)."""

    def to_json(self) -> dict[str, Any]: ...


class GcRefusedError(AuroraError, RuntimeError):
    """gc found problems in the part of the bucket it would keep, and deleted nothing."""

    def __init__(self, message: str, problems: Iterable[_ReportedProblem]) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class ServiceError(AuroraError, RuntimeError):
    """A local server (Valkey, SeaweedFS, the GCS emulator) could not be started or used."""


class ServerExitedError(ServiceError):
    """A local server process exited before it was ready, typically because a port chosen for it was taken
    by someone else between choosing and binding (ports come from ``bind(0)``, like outgoing connections')."""


class PlanError(AuroraError, ValueError):
    """A deployment plan (``aurora plan``) is malformed: unknown model, missing field, value out of range."""


# --- process lifecycle -----------------------------------------------------------------------------


class Terminated(SystemExit):
    """The process was told to stop (SIGTERM, SIGINT) while it had no graceful path to take (starting up,
    bootstrapping, a harness), or a second time: raised in the main thread to unwind it through every
    ``finally`` and context manager.

    Deliberately outside :class:`AuroraError` and not an :class:`Exception`: the ``except Exception`` of a
    retry loop or of a failed-scenario report must not swallow it. Uncaught, it ends the interpreter quietly
    with ``code`` (128 + the signal number, as a shell reports a process ended by that signal)."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.signal_name = name

    def __str__(self) -> str:
        return f"terminated by {self.signal_name}"
