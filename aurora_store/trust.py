"""Signed manifests: the root of trust when buckets, relays and caches are not all trusted.

Segments are named by their SHA-256, so once a manifest is authentic every byte it names is too. The
trainer signs every delta and snapshot manifest with Ed25519 over the canonical JSON of the manifest
without its ``signature`` field, prefixed with a domain tag; actors and relays hold the trainer's public key
(never read from a bucket) and refuse anything that does not verify — before downloading its segments.

Keys are 32-byte Ed25519 seeds / public keys, stored as base64 text (a file path or the value itself).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.errors import ConfigError, SignatureError

ALGORITHM = "ed25519"
_DOMAIN = b"aurora-manifest-v1\x00"


_S = TypeVar("_S")


class Signable(Protocol):
    """A signed document (frozen: ``signature`` is read-only, :meth:`with_signature` returns a copy)."""

    @property
    def signature(self) -> Mapping[str, str] | None: ...

    def signing_bytes(self) -> bytes: ...

    def with_signature(self: _S, signature: Mapping[str, str]) -> _S: ...


M = TypeVar("M", bound=Signable)


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def _read_spec(spec: str, what: str) -> bytes:
    """A key given as a file path or as base64 text."""
    text = spec.strip()
    path = Path(text).expanduser()
    if len(text) < 200 and path.is_file():
        text = path.read_text().strip()
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{what} is neither a readable file nor base64 key material") from None
    if len(raw) != 32:
        raise ConfigError(f"{what} must be 32 bytes of base64 (an Ed25519 key), got {len(raw)} bytes")
    return raw


@dataclass(frozen=True)
class Signer:
    private_key: Ed25519PrivateKey

    @classmethod
    def load(cls, spec: str) -> Signer:
        return cls(Ed25519PrivateKey.from_private_bytes(_read_spec(spec, "signing key")))

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    def sign(self, manifest: M) -> M:
        signature = self.private_key.sign(_DOMAIN + manifest.signing_bytes())
        return manifest.with_signature({"alg": ALGORITHM, "key_id": key_id(self.public_key),
                                        "sig": base64.b64encode(signature).decode()})

    __call__ = sign


@dataclass(frozen=True)
class Verifier:
    """Checks a manifest's signature and, when given a ``run``, that the signed ``producer.run`` names it: one
    trainer key may sign several runs, and a valid manifest of run B must not be applied in run A."""

    public_key: Ed25519PublicKey
    run: str | None = None

    @classmethod
    def load(cls, spec: str, run: str | None = None) -> Verifier:
        return cls(Ed25519PublicKey.from_public_bytes(_read_spec(spec, "trainer public key")), run)

    def verify(self, manifest: Signable) -> None:
        """Raise :class:`SignatureError` unless ``manifest`` carries a valid signature of this key."""
        signature = manifest.signature
        what = f"{type(manifest).__name__} {getattr(manifest, 'version', '?')}"
        if not signature:
            raise SignatureError(f"{what} is not signed")
        if not isinstance(signature, dict) or signature.get("alg") != ALGORITHM:
            raise SignatureError(f"{what}: unsupported signature {signature!r:.80}")
        if signature.get("key_id") != key_id(self.public_key):
            raise SignatureError(f"{what} is signed by key {signature.get('key_id')}, expected "
                                 f"{key_id(self.public_key)}")
        try:
            raw = base64.b64decode(str(signature.get("sig", "")), validate=True)
            self.public_key.verify(raw, _DOMAIN + manifest.signing_bytes())
        except (InvalidSignature, binascii.Error, ValueError):
            raise SignatureError(f"{what}: signature does not match its content") from None
        if self.run is not None:
            check_run(manifest, self.run)

    __call__ = verify


def check_run(manifest: object, run: str) -> None:
    """Raise :class:`SignatureError` unless ``manifest.producer["run"]`` is ``run`` (FORMAT §4.2)."""
    producer = getattr(manifest, "producer", None) or {}
    found = producer.get("run") if isinstance(producer, Mapping) else None
    if found != run:
        what = f"{type(manifest).__name__} {getattr(manifest, 'version', '?')}"
        raise SignatureError(f"{what} belongs to run {str(found)[:80]!r}, not {run!r}")


@dataclass(frozen=True)
class RunCheck:
    """For a reader given a run but no key: refuse manifests that name another run (not authenticated)."""

    run: str

    def __call__(self, manifest: object) -> None:
        check_run(manifest, self.run)


def manifest_check(public_key: str | None, run: str | None) -> Verifier | RunCheck | None:
    """The check a reader configured with an optional trainer key and an optional run applies to manifests."""
    if public_key:
        return Verifier.load(public_key, run)
    return RunCheck(run) if run else None


def generate_keypair() -> tuple[str, str]:
    """``(private, public)`` as base64 text."""
    private = Ed25519PrivateKey.generate()
    raw_private = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())
    return base64.b64encode(raw_private).decode(), base64.b64encode(_raw_public(private.public_key())).decode()


def write_keypair(directory: str | os.PathLike, name: str = "trainer") -> tuple[Path, Path]:
    """Write ``<name>.key`` (mode 0600) and ``<name>.pub``; refuses to overwrite an existing key."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private, public = generate_keypair()
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{key_path} already exists; refusing to overwrite a signing key") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(private + "\n")
    pub_path.write_text(public + "\n")
    return key_path, pub_path
