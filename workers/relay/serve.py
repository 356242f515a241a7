"""The relay's read-only segment endpoint: its region's actors read hot segments from the relay's memory
(or its disk tier) as soon as they have arrived from the source bucket — before the regional bucket
write completes.

``GET``/``HEAD /segments/<sha256>``: 200 with the bytes, 404 when not cached, 401 without the run's bearer
token (weights are confidential), 503 when more than ``max_connections`` authorised requests are being
served. It serves only what the relay fetched and verified; readers verify every byte against the name
anyway, so a wrong answer costs them a bucket read, never a wrong weight.

A client without the token must not be able to lock the region's actors out: a connection gets
``header_deadline_s`` in all to send its request line and headers (not per read — a byte every few seconds
would otherwise hold it for ever), one client address holds at most ``per_client`` connections that have
not sent their headers yet, and a serving slot is taken only once the request is authorised. By default the
endpoint listens on this machine's private address, not on every interface.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import re
import socket
import threading
import time
from collections import Counter
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

    def parse_request(self) -> bool:
        # Request line and headers are in (or the connection is over): the header deadline is met.
        try:
            return super().parse_request()
        finally:
            self.server.headers_done(self.connection)

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
        if not server.take_slot():
            server.metrics.cache_refused.labels("busy").inc()
            self._empty(503, {"Retry-After": "1"})
            return
        try:
            self._serve(body)
        finally:
            server.release_slot()

    def _serve(self, body: bool) -> None:
        server = self.server
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
    """Serves ``lookup(digest)`` over HTTP; at most ``max_connections`` authorised requests at a time (HTTP/1.0:
    one request per connection, so a connection is a request). See the module doc for what a client without
    the token can hold: ``per_client`` connections, each for ``header_deadline_s``."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], lookup: Lookup, token: str, metrics: Metrics, *,
                 max_connections: int = 16, header_deadline_s: float = 5.0, per_client: int = 8) -> None:
        if not token:
            raise ConfigError("the segment cache is served only with a token")
        if not header_deadline_s > 0 or per_client < 1 or max_connections < 1:
            raise ConfigError("the cache server needs a positive header deadline, per-client and connection bound")
        self.lookup = lookup
        self._token = f"Bearer {token}".encode()
        self.metrics = metrics
        self.header_deadline_s = header_deadline_s
        self.per_client = per_client
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._unheard: dict[socket.socket, tuple[float, str]] = {}  # no headers yet → (deadline, client)
        self._unheard_by_client: Counter[str] = Counter()
        self.expired = 0  # connections closed for missing the header deadline
        super().__init__(address, _Handler)

    def authorized(self, header: str) -> bool:
        return hmac.compare_digest(header.encode("utf-8", "replace"), self._token)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def take_slot(self) -> bool:
        return self._slots.acquire(blocking=False)

    def release_slot(self) -> None:
        self._slots.release()

    def process_request(self, request, client_address) -> None:
        client = str(client_address[0])
        with self._lock:
            admitted = self._unheard_by_client[client] < self.per_client
            if admitted:
                self._unheard_by_client[client] += 1
                self._unheard[request] = (time.monotonic() + self.header_deadline_s, client)
        if not admitted:  # this address already has its share of connections that have not spoken yet
            self.metrics.cache_refused.labels("busy").inc()
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.headers_done(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.headers_done(request)  # a connection closed before its headers ends its deadline too

    def headers_done(self, request: socket.socket) -> None:
        with self._lock:
            entry = self._unheard.pop(request, None)
            if entry is not None:
                self._unheard_by_client[entry[1]] -= 1
                if self._unheard_by_client[entry[1]] <= 0:
                    del self._unheard_by_client[entry[1]]

    def unheard(self) -> int:
        """Connections that have not sent their request line and headers yet."""
        with self._lock:
            return len(self._unheard)

    def _expire_slow(self) -> None:
        """Close every connection past its header deadline: its handler's read then ends at once."""
        while not self._stopping.wait(0.1):
            now = time.monotonic()
            with self._lock:
                late = [sock for sock, (deadline, _) in self._unheard.items() if deadline <= now]
            for sock in late:
                self.headers_done(sock)
                self.expired += 1
                self.metrics.cache_refused.labels("slow").inc()
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def start(self) -> CacheServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="relay-cache-server", daemon=True)
        self._watchdog = threading.Thread(target=self._expire_slow, name="relay-cache-deadlines", daemon=True)
        self._thread.start()
        self._watchdog.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.shutdown()
        self.server_close()
        for thread in (self._thread, self._watchdog):
            if thread is not None:
                thread.join(timeout=5)


def private_address() -> str:
    """This machine's first private (RFC 1918 / unique-local) IPv4 address by its host name — where a region's
    actors reach their relay — else the loopback address: never every interface by default."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if address.is_private and not address.is_loopback and not address.is_link_local:
            return str(address)
    return "127.0.0.1"


def advertised_url(host: str | None, port: int, bind: str | None = None) -> str:
    """The URL actors are told (in the relay's heartbeat): ``host``, else the address bound (when it is one
    address, not every interface), else this machine's name."""
    if host is None and bind and bind not in ("0.0.0.0", "::", ""):
        host = bind
    return f"http://{host or socket.getfqdn()}:{port}"
