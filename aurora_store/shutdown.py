"""A process-wide termination request, which the library's waits consult.

A process asked to stop (SIGTERM from a spot VM's preemption notice or a pod's eviction: 30-120 s) must not
spend that time in a reconnect loop towards a Redis that is down: once :func:`request` has been called, the
control plane's retries stop retrying (a healthy server is still used, so a graceful leave can hand its
leases back), and :func:`sleep` returns early.

The request is a plain attribute, not a :class:`threading.Event`: it is set from a signal handler, which
runs in the main thread between two bytecodes — possibly while that thread is inside an ``Event``'s own
(non-reentrant) lock, which the handler would then wait for forever. Waits therefore poll (every
:data:`POLL_S`); they are retry backoffs, where 50 ms more or less does not matter.
"""

from __future__ import annotations

import time

#: How often :func:`sleep` looks at the request.
POLL_S = 0.05

_reason: str | None = None


def request(reason: str) -> None:
    """Ask the process to stop (idempotent: the first reason is kept). Safe to call from a signal handler."""
    global _reason
    if _reason is None:
        _reason = reason or "stop requested"


def requested() -> str | None:
    """Why the process is stopping (e.g. ``"SIGTERM"``), or ``None`` while it is not."""
    return _reason


def sleep(seconds: float) -> bool:
    """Sleep up to ``seconds``, ending within :data:`POLL_S` of a request. Returns whether one was made."""
    deadline = time.monotonic() + seconds
    while _reason is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(POLL_S, remaining))
    return True


def reset() -> None:
    """Forget the request (for tests that request one in-process)."""
    global _reason
    _reason = None
