"""The one parse gate for JSON read from outside the process: manifests, layouts, the run record, bus messages.

Everything parsed here may come from a bucket or a stream someone else can write, so a document is refused
with a typed error (``ManifestError`` unless the caller names another :class:`AuroraError`) when it is
larger than ``max_bytes``, nests deeper than ``max_depth``, holds a non-finite number (``NaN``,
``Infinity``, ``1e400``) or an integer too long to parse. Field accessors (:func:`integer`, :func:`text`,
…) then insist on the JSON type the format defines, so ``"version": 1.0`` or ``true`` is refused instead of
being coerced, and ``int(float("inf"))``'s ``OverflowError`` can never happen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from aurora_store.errors import AuroraError, ManifestError

#: Largest document accepted (a manifest of a 70B model with 4 MiB segments is ~10 MB).
MAX_DOCUMENT_BYTES = 64 << 20
#: Deepest nesting accepted; Aurora's own documents nest at most 5 levels (a chunk inside a segment).
MAX_DEPTH = 32
#: Integers are u64 on the wire (FORMAT §3) but Python, numpy and JSON readers agree only up to 2**63 − 1.
MAX_INT = (1 << 63) - 1

ErrorType = type[AuroraError]


def loads(data: bytes | bytearray | memoryview | str, *, what: str = "document", error: ErrorType = ManifestError,
          max_bytes: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` as JSON within the gate's limits, or raise ``error``."""
    size = len(data)
    if size > max_bytes:
        raise error(f"{what} is {size} bytes, more than the {max_bytes} accepted")
    if isinstance(data, memoryview):
        data = bytes(data)

    def non_finite(name: str) -> NoReturn:
        raise error(f"{what} holds the non-finite number {name}")

    def finite_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            non_finite(literal[:40])
        return value

    try:
        doc = json.loads(data, parse_constant=non_finite, parse_float=finite_float)
    except AuroraError:
        raise
    except RecursionError:
        raise error(f"{what} nests deeper than the {max_depth} levels accepted") from None
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise error(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    _check_depth(doc, max_depth, what, error)
    return doc


def load_object(data: bytes | bytearray | memoryview | str, *, what: str = "document",
                error: ErrorType = ManifestError, **limits: int) -> dict[str, Any]:
    """:func:`loads` for documents that must be a JSON object."""
    return mapping(loads(data, what=what, error=error, **limits), what, error)


def _check_depth(doc: Any, max_depth: int, what: str, error: ErrorType) -> None:
    # Iterative, so a document just under the parser's recursion limit cannot overflow this walk either.
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise error(f"{what} nests deeper than the {max_depth} levels accepted")
        stack.extend((child, depth + 1) for child in children)


# --- typed field access ------------------------------------------------------------------------------


def integer(value: Any, what: str, error: ErrorType = ManifestError, *, minimum: int = 0,
            maximum: int = MAX_INT) -> int:
    """``value`` if it is a JSON integer (not a float, not a boolean) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be an integer, got {_show(value)}")
    if not minimum <= value <= maximum:
        raise error(f"{what} must be within [{minimum}, {maximum}], got {_show(value)}")
    return value


def text(value: Any, what: str, error: ErrorType = ManifestError) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {_show(value)}")
    return value


def mapping(value: Any, what: str, error: ErrorType = ManifestError) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise error(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def array(value: Any, what: str, error: ErrorType = ManifestError) -> list[Any]:
    if not isinstance(value, list):
        raise error(f"{what} must be a JSON array, got {type(value).__name__}")
    return value


def field(doc: Mapping[str, Any], key: str, what: str, error: ErrorType = ManifestError) -> Any:
    try:
        return doc[key]
    except KeyError:
        raise error(f"{what} has no {key!r}") from None


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)[:80]
