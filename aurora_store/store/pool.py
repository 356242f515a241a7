"""One long-lived pool of transfer threads per process, shared by every upload, fetch and relay copy.

Why one pool: a pool built per call (per version) starts new threads every version, and anything kept per
thread dies with them. Connections are what matter: a new one pays the TCP (and TLS) handshake and starts in
slow start, so the first segments of every version crawled across a WAN. Threads that persist — and, in
:class:`~aurora_store.store.s3.S3Bucket`, one boto3 client per bucket whose connection pool is sized for
this pool — keep their keep-alive connections from one version to the next.

Each caller limits its own concurrency with a :class:`Lanes` (``streams`` at a time, in submission order),
so several publishes and fetches can share the pool without one taking every thread. The pool is bounded
(``workers`` threads; queued work waits), closed at interpreter exit, and deadlock-free by construction:
work running on a pool thread never waits for other queued pool work — :meth:`Lanes.submit` from a pool
thread runs the call inline instead of queueing it behind itself.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from aurora_store.errors import AuroraError

R = TypeVar("R")

#: Threads of the process-wide pool: enough for a publish and a fetch (or a relay's copies) at 4–8 streams
#: each to run at once; more streams than this in total only queue.
DEFAULT_WORKERS = 32

_in_pool = threading.local()


class PoolClosedError(AuroraError, RuntimeError):
    """Work was submitted to a transfer pool after it was closed (the process is exiting)."""


class TransferPool:
    """A bounded, closable thread pool whose threads live as long as the process (see the module doc)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "aurora-xfer") -> None:
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                                            initializer=self._mark_thread)
        self._closed = False
        self._lock = threading.Lock()

    def _mark_thread(self) -> None:
        _in_pool.pool = self

    def owns_current_thread(self) -> bool:
        return getattr(_in_pool, "pool", None) is self

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the transfer pool is closed (the process is exiting)")
            return self._executor.submit(fn, *args)

    def lanes(self, limit: int) -> Lanes:
        return Lanes(self, limit)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, wait: bool = True) -> None:
        """Refuse new work; with ``wait``, let queued and running work finish first."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=not wait)


class Lanes:
    """At most ``limit`` calls of one caller running on a shared pool at a time, started in submission order.

    Calls queue here (not in the pool) and are drained by at most ``limit`` pool tasks, so a caller with
    ``streams`` streams uses at most that many threads however much it submits, and ``Future.cancel`` on a
    call not yet started takes effect. Submitting never blocks.
    """

    def __init__(self, pool: TransferPool, limit: int) -> None:
        self.pool = pool
        self.limit = max(1, limit)
        self._queue: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._running = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        future: Future[R] = Future()
        if self.pool.owns_current_thread():
            # Called from pool work (e.g. a callback): queueing behind ourselves and waiting could deadlock a
            # saturated pool, so run it here, now.
            self._run(future, fn, args)
            return future
        with self._lock:
            self._queue.append((future, fn, args))
            start = self._running < self.limit
            if start:
                self._running += 1
        if start:
            try:
                self.pool.submit(self._drain)
            except PoolClosedError:
                with self._lock:
                    self._running -= 1
                raise
        return future

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running -= 1
                    return
                future, fn, args = self._queue.popleft()
            self._run(future, fn, args)

    @staticmethod
    def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to whoever waits on the future, like ThreadPoolExecutor does
            future.set_exception(exc)
        else:
            future.set_result(result)


_shared: TransferPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> TransferPool:
    """The process's transfer pool, made on first use and closed at interpreter exit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.closed:
            _shared = TransferPool()
        return _shared


@atexit.register
def _close_shared() -> None:
    with _shared_lock:
        if _shared is not None:
            _shared.close(wait=False)
