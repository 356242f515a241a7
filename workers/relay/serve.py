"""The relay's read-only segment endpoint: its region's actors read hot segments from the relay's memory
(or its disk tier) as soon as they have arrived from the source bucket — before the regional bucket
write completes.

``GET``/``HEAD /segments/<sha256>``: 200 with the bytes, 404 when not cached, 401 without the run's bearer
token (weights are confidential), 503 when more than ``max_connections`` requests are being served. It
serves only what the relay fetched and verified; readers verify every byte against the name anyway, so a
wrong answer costs them a bucket read, never a wrong weight.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aurora_store.errors import ConfigError
from aurora_store.metrics import Metrics

log = logging.getLogger("aurora.relay.serve")

_PATH = re.compile(r"/segments/([0-9a-f]{64})")
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

Lookup = Callable[[str], bytes | None]


class _Handler(BaseHTTPRequestHandler):
    server: CacheServer
    timeout = 10  # a client that stalls mid-request loses its slot, it cannot hold it forever
    server_version = "aurora-relay-cache"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        server = self.server
        if not server.authorized(self.headers.get("Authorization", "")):
            server.metrics.cache_refused.labels("auth").inc()
            self._empty(401, {"WWW-Authenticate": 'Bearer realm="aurora-cache"'})
            return
        match = _PATH.fullmatch(self.path)
        if match is None:
            self._empty(404)
            return
        data = server.lookup(match.group(1))
        if data is None:
            self._empty(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
            server.metrics.cache_served_bytes.inc(len(data))

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        log.debug(format, *args)


class CacheServer(ThreadingHTTPServer):
    """Serves ``lookup(digest)`` over HTTP; bounded to ``max_connections`` at a time (HTTP/1.0: one request
    per connection, so a connection is a request)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], lookup: Lookup, token: str, metrics: Metrics, *,
                 max_connections: int = 16) -> None:
        if not token:
            raise ConfigError("the segment cache is served only with a token")
        self.lookup = lookup
        self._token = f"Bearer {token}".encode()
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        super().__init__(address, _Handler)

    def authorized(self, header: str) -> bool:
        return hmac.compare_digest(header.encode("utf-8", "replace"), self._token)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.metrics.cache_refused.labels("busy").inc()
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def start(self) -> CacheServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="relay-cache-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def advertised_url(host: str | None, port: int) -> str:
    """The URL actors are told (in the relay's heartbeat): ``host`` or this machine's name."""
    return f"http://{host or socket.getfqdn()}:{port}"
