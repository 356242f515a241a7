"""A small fault-injecting HTTP proxy to put in front of a real S3 server.

Requests are forwarded verbatim (the Host header is kept, so SigV4 signatures still verify upstream);
with configurable probabilities the proxy instead answers 503 SlowDown / 500 InternalError, delays the
response, or stalls until the client's read timeout fires. It produces the faults that can't be produced
on demand with a real, healthy server.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ERRORS = [(503, "SlowDown", "Please reduce your request rate (injected)"),
           (500, "InternalError", "We encountered an internal error (injected)")]


@dataclass
class FaultRates:
    error: float = 0.0  # answer 5xx
    slow: float = 0.0  # delay the (real) response by ``slow_s``
    stall: float = 0.0  # hold the request for ``stall_s`` (longer than the client's read timeout), then drop it
    slow_s: float = 0.3
    stall_s: float = 6.0
    only_methods: tuple[str, ...] = ()  # e.g. ("GET",) — empty: all


@dataclass
class FaultCounters:
    requests: int = 0
    errors: int = 0
    slow: int = 0
    stalls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "errors": self.errors, "slow": self.slow, "stalls": self.stalls}


class FaultProxy:
    def __init__(self, upstream: str, rates: FaultRates | None = None, *, seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        parsed = upstream.removeprefix("http://").rstrip("/")
        self.upstream_host, _, port_text = parsed.partition(":")
        self.upstream_port = int(port_text or 80)
        self.rates = rates or FaultRates()
        self.counters = FaultCounters()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline().strip():  # trailers
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._draw(self.command)
                if fault == "error":
                    status, code, message = proxy._pick(_ERRORS)
                    payload = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                               f"<Message>{message}</Message></Error>").encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if fault == "stall":
                    time.sleep(proxy.rates.stall_s)
                    self.close_connection = True
                    return
                if fault == "slow":
                    time.sleep(proxy.rates.slow_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "expect")}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    head = self.command == "HEAD"  # a HEAD answer keeps the object's Content-Length
                    for key, value in response.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection") and (
                                head or key.lower() != "content-length"):
                            self.send_header(key, value)
                    if not head:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.host = host
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fault-proxy")

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _pick(self, items):
        with self._rng_lock:
            return self._rng.choice(items)

    def _draw(self, method: str) -> str | None:
        rates = self.rates
        with self.counters.lock:
            self.counters.requests += 1
        if rates.only_methods and method not in rates.only_methods:
            return None
        with self._rng_lock:
            x = self._rng.random()
        for name, p in (("error", rates.error), ("stall", rates.stall), ("slow", rates.slow)):
            if x < p:
                with self.counters.lock:
                    attr = {"error": "errors", "stall": "stalls", "slow": "slow"}[name]
                    setattr(self.counters, attr, getattr(self.counters, attr) + 1)
                return name
            x -= p
        return None

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
