"""Signed JSON documents: the one implementation of canonical bytes, signing bytes and signatures.

Delta manifests and snapshot manifests are both frozen dataclasses that serialise to a JSON object and may
carry an Ed25519 ``signature`` object (:mod:`aurora_store.trust`). What is signed is the canonical JSON
(sorted keys, no insignificant whitespace, UTF-8) of the document without its ``signature`` member, so the
same document always has the same bytes and a retried create can be resolved by comparing them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeVar

D = TypeVar("D", bound="SignedDocument")


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class SignedDocument:
    """Base of a frozen dataclass document with a ``signature`` field; subclasses implement :meth:`body`."""

    signature: Mapping[str, str] | None

    def body(self) -> dict[str, Any]:
        """The document's JSON object without its signature."""
        raise NotImplementedError

    def to_json(self, *, with_signature: bool = True) -> dict[str, Any]:
        doc = self.body()
        if with_signature and self.signature is not None:
            doc["signature"] = dict(self.signature)
        return doc

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    def signing_bytes(self) -> bytes:
        """The bytes a signature covers: the canonical document without its signature."""
        return canonical_json(self.to_json(with_signature=False))

    def with_signature(self: D, signature: Mapping[str, str] | None) -> D:
        return replace(self, signature=signature)  # type: ignore[type-var]  # subclasses are dataclasses
