"""Connecting to Redis: AUTH and TLS from the URL, typed errors, reconnects with backoff.

Redis is only a notification channel; the bucket is the truth. Components therefore treat a lost
connection as routine: they reconnect, and whoever may have missed events re-reads the bucket — except
once the process is stopping (:mod:`aurora_store.shutdown`): then a failed call is not retried, so a
process told to leave during an outage leaves at once instead of waiting out the outage.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from aurora_store import shutdown
from aurora_store.errors import BusAuthError, BusError

T = TypeVar("T")
log = logging.getLogger("aurora.bus")

#: Longest blocking read (ms). The socket timeout is set well above it: redis-py raises a timeout if a
#: blocking XREAD outlives the socket timeout.
BLOCK_MS = 1000
SOCKET_TIMEOUT_S = 5.0


def connect(url: str, *, wait_s: float = 0.0, socket_timeout: float = SOCKET_TIMEOUT_S,
            ssl_ca_certs: str | None = None) -> redis.Redis:
    """A client for ``url`` (``redis://[:password@]host:port/db`` or ``rediss://`` for TLS), verified with
    PING. Retries for up to ``wait_s`` while the server is unreachable; credential and TLS failures are
    not retried (they will not fix themselves) and raise :class:`BusAuthError`."""
    kwargs: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": min(socket_timeout, 5.0),
                              "health_check_interval": 15, "decode_responses": False}
    if url.startswith("rediss://") and ssl_ca_certs:
        kwargs["ssl_ca_certs"] = ssl_ca_certs
    try:
        client = redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise BusError(f"invalid Redis URL: {exc}") from None
    deadline = time.monotonic() + wait_s
    delay = 0.2
    while True:
        try:
            client.ping()
            return client
        except Exception as exc:  # translated below
            error = translate(exc, url)
            if url.startswith("redis://") and _closed_on_connect(exc):
                # A server that hangs up on the first command of a plain connection speaks TLS only:
                # retrying cannot help.
                error = BusAuthError(f"{redact(url)} closed the connection at once: it probably requires TLS "
                                     f"(use rediss://) ({exc})")
            if isinstance(error, BusAuthError) or time.monotonic() >= deadline or shutdown.requested():
                client.close()
                raise _stopping(error) from None
            log.warning("Redis not reachable yet, retrying", extra={"error": str(exc)})
            shutdown.sleep(delay)
            delay = min(delay * 2, 2.0)


def _stopping(error: BusError) -> BusError:
    """``error``, saying so when it was not retried because the process is stopping."""
    reason = shutdown.requested()
    if reason is None or isinstance(error, BusAuthError):
        return error
    return type(error)(f"{error} (not retried: stopping on {reason})")


def _closed_on_connect(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, redis.ConnectionError) and ("reset by peer" in text or "Connection closed" in text)


def redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def translate(exc: BaseException, url: str = "") -> BusError:
    """Map redis-py / socket / TLS exceptions to Aurora's typed errors."""
    where = redact(url) if url else "Redis"
    if isinstance(exc, BusError):
        return exc
    if isinstance(exc, redis.AuthenticationError) or (
            isinstance(exc, redis.ResponseError) and any(s in str(exc) for s in ("NOAUTH", "WRONGPASS", "NOPERM"))):
        return BusAuthError(f"{where} rejected the credentials ({exc}); check the password in the URL")
    if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__ or "ssl" in str(exc).lower():
        return BusAuthError(f"TLS handshake with {where} failed ({exc}); use rediss:// for a TLS server and "
                            f"redis:// for a plain one")
    if isinstance(exc, redis.ConnectionError) and "Connection reset" in str(exc) and url.startswith("redis://"):
        return BusError(f"{where} closed the connection: is it a TLS-only server (use rediss://)? ({exc})")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return BusError(f"cannot reach {where}: {exc}")
    return BusError(f"Redis error from {where}: {exc}")


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)) and not \
        isinstance(exc, redis.AuthenticationError)


class Reconnecting:
    """Runs Redis calls, reconnecting with backoff when the server goes away (e.g. a restart).

    redis-py silently reconnects on the next command, so a restarted server (which lost every stream,
    group and state) is detected by its ``run_id`` changing, checked at most every ``check_every_s``.
    ``on_reconnect`` is then called so the owner can re-create what was lost (consumer groups,
    registrations) and resynchronise from the bucket.
    """

    def __init__(self, url: str, *, wait_s: float = 30.0, on_reconnect: Callable[[], None] | None = None,
                 check_every_s: float = 1.0) -> None:
        self.url = url
        self.client = connect(url, wait_s=wait_s)
        self.on_reconnect = on_reconnect
        self.reconnects = 0
        self._check_every = check_every_s
        self._server_id = self._run_id()
        self._checked = time.monotonic()
        self._in_callback = False

    def _run_id(self) -> str:
        return str(self.client.info("server").get("run_id", ""))

    def _detect_restart(self) -> None:
        if self._in_callback or time.monotonic() - self._checked < self._check_every:
            return
        self._checked = time.monotonic()
        server_id = self._run_id()
        if server_id != self._server_id:
            self._server_id = server_id
            self._restarted()

    def _restarted(self) -> None:
        self.reconnects += 1
        log.warning("Redis server changed (restart or failover); re-creating state")
        if self.on_reconnect is not None:
            self._in_callback = True
            try:
                self.on_reconnect()
            finally:
                self._in_callback = False

    def call(self, fn: Callable[[redis.Redis], T], *, give_up_s: float = 60.0) -> T:
        deadline = time.monotonic() + give_up_s
        delay = 0.1
        while True:
            try:
                self._detect_restart()
                return fn(self.client)
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() >= deadline or shutdown.requested():
                    raise _stopping(translate(exc, self.url)) from exc
                log.warning("Redis connection lost; reconnecting", extra={"error": str(exc)})
                if shutdown.sleep(delay):
                    raise _stopping(translate(exc, self.url)) from exc
                delay = min(delay * 2, 1.0)
                self._checked = 0.0  # verify the server identity on the next attempt

    def close(self) -> None:
        self.client.close()
