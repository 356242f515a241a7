"""Who may answer a lease: per-actor Ed25519 keys, admission by an operator-provisioned secret.

Every actor host holds the Redis URL, so nothing an actor proves itself with may live in Redis readable by
others. Each actor process generates an Ed25519 key pair at start and keeps the private half in memory only;
it registers the public half together with an *admission proof*, an HMAC over (run, actor id, public key)
keyed by the admission secret that the operator provisions through the secret store (never through Redis or
instance user data). The trainer admits a registration only if the proof verifies, binds each lease it grants
to the holder's public key at that moment, and accepts a result only if it is signed by that key.

Why a key pair rather than a per-actor HMAC key: an HMAC key has to be known to the trainer too, so it would
have to be either derived from a secret every actor holds (then any actor can compute any other's key) or
handed out over a channel the trainer writes — and the only channel is Redis. A public key can be published
in Redis for anyone to read and still proves nothing to whoever reads it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.bus.messages import RolloutResult
from aurora_store.errors import ConfigError

_RESULT_DOMAIN = b"aurora-result-v1\x00"
_ADMISSION_DOMAIN = b"aurora-admission-v1\x00"
#: Base64 of a raw 32-byte Ed25519 public key, and of a 64-byte signature.
PUBLIC_KEY_CHARS = 44
SIGNATURE_CHARS = 88
#: An admission secret shorter than this is refused: it is the one thing between a Redis URL and a seat.
MIN_SECRET_CHARS = 16


def signing_bytes(run: str, fields: Mapping[str, str]) -> bytes:
    """What a result signature covers: the run and every stream field but ``signature``, canonically."""
    body = {k: v for k, v in fields.items() if k != "signature"}
    return _RESULT_DOMAIN + run.encode() + b"\x00" + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ActorKey:
    """An actor's private key: generated at process start, never written anywhere."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> ActorKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public(self) -> str:
        raw = self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def sign(self, run: str, fields: Mapping[str, str]) -> str:
        return base64.b64encode(self.private_key.sign(signing_bytes(run, fields))).decode()

    def signed(self, run: str, result: RolloutResult) -> RolloutResult:
        """``result`` with this key's signature over its fields."""
        return dataclasses.replace(result, signature=self.sign(run, result.to_fields()))


@functools.lru_cache(maxsize=4096)
def _public_key(text: str) -> Ed25519PublicKey | None:
    if len(text) != PUBLIC_KEY_CHARS:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return None


def verify(public_key: str, run: str, fields: Mapping[str, str], signature: str) -> bool:
    """Whether ``signature`` is ``public_key``'s over ``fields`` of ``run``; any malformed input is a no."""
    key = _public_key(public_key)
    if key is None or len(signature) != SIGNATURE_CHARS:
        return False
    try:
        key.verify(base64.b64decode(signature, validate=True), signing_bytes(run, fields))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def check_secret(secret: str | None, what: str = "AURORA_ADMISSION_SECRET") -> str:
    """The admission secret, or a :class:`ConfigError` naming what is missing or too weak."""
    if not secret:
        raise ConfigError(f"{what} is not set: actors are admitted only with the operator's admission secret "
                          "(provision it through the secret store, e.g. 32 random bytes as base64)")
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"{what} must be at least {MIN_SECRET_CHARS} characters, got {len(secret)}")
    return secret


def admission_proof(secret: str, run: str, actor_id: str, public_key: str) -> str:
    """HMAC-SHA256 of (run, actor id, public key) under the admission secret, hex."""
    message = _ADMISSION_DOMAIN + b"\x00".join(s.encode() for s in (run, actor_id, public_key))
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def admitted(secret: str, run: str, actor_id: str, public_key: str, proof: str) -> bool:
    if _public_key(public_key) is None or len(proof) != 64:
        return False
    return hmac.compare_digest(admission_proof(secret, run, actor_id, public_key), proof)


@dataclass(frozen=True)
class Credentials:
    """What an actor registers besides its state: its public key and the admission proof binding it."""

    public_key: str = ""
    admission: str = ""

    @classmethod
    def issue(cls, key: ActorKey, secret: str, run: str, actor_id: str) -> Credentials:
        return cls(key.public, admission_proof(secret, run, actor_id, key.public))

    def to_fields(self) -> dict[str, str]:
        return {"public_key": self.public_key, "admission": self.admission}
