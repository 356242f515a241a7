"""How Aurora's processes end: SIGTERM and SIGINT are honoured in every state, within a grace period.

A spot VM or a pod gets 30-120 s between its termination notice and the kill. :func:`install` arms three
ways for a process to end, each a backstop for the one before:

1. **Graceful** — in a phase with a graceful path (the actor's main loop: hand leases back, deregister; the
   relay's and trainer's loops), the handler logs one line naming the signal and the phase, marks the
   process as stopping (:mod:`aurora_store.shutdown`, which the library's retry loops consult: a Redis that
   is down no longer holds the process for its reconnect budget) and calls the process's stop callbacks
   (:meth:`Lifecycle.on_stop`), whose loops then end on their own path.
2. **Unwinding** — in a phase without one (starting: connecting, waiting for the run, bootstrapping), in a
   harness (the demo, the chaos suite: their children are stopped by their context managers), on a second
   signal, or when the graceful path has not ended after half the grace period (a batch that generates
   on, a step that trains on), the handler raises :class:`~aurora_store.errors.Terminated` in the main
   thread, which unwinds it through every ``finally`` and ``with`` — the actor's leave is one, so its
   leases are still handed back; :meth:`Lifecycle.run` then ends the process by the same signal (exit
   status ``-15`` to its parent, as if it had not been caught).
3. **The deadline** — a watchdog thread, woken by the signal itself (``signal.set_wakeup_fd``: written by
   the C-level handler, so a main thread stuck in native code or a blocking call cannot delay it), ends
   the process with ``os._exit(128 + signal)`` when the grace period has passed, whatever it is doing.

Stop callbacks run inside the signal handler, in the main thread, between two bytecodes: they must only set
a flag or an :class:`threading.Event` that the main thread tests but never waits on (waiting holds the
event's lock, which the handler would then wait for forever).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from aurora_store import config, shutdown
from aurora_store.errors import Terminated

log = logging.getLogger("aurora.lifecycle")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Share of the grace period the graceful path gets before the main thread is unwound (the rest is for the
#: ``finally`` blocks, e.g. the actor's leave).
GRACEFUL_SHARE = 0.5
#: A harness outlives its children: their grace, then the launcher's kill and the servers' stop.
HARNESS_EXTRA_S = 30.0


class Lifecycle:
    """The installed handlers of one process (see the module docstring); made by :func:`install`."""

    def __init__(self, process: str, grace_s: float, *, harness: bool) -> None:
        self.process = process
        self.grace_s = grace_s
        self.harness = harness
        self.phase = "running its children" if harness else "starting"
        self.graceful = False  # whether the current phase has a graceful path
        self.signals = 0  # stop signals received
        self.first_signal_at: float | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._in_handler = False
        self._unwind = False  # set by the watchdog: the graceful path took too long
        self._returned = False  # main() has returned: the interpreter is exiting, nothing is left to unwind
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # --- what the process tells us ---------------------------------------------------------------

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a stop signal arrives in a graceful phase (at once if one already has)."""
        self._callbacks.append(callback)
        if self.signals and self.graceful:
            callback()

    def enter(self, phase: str, *, graceful: bool = True) -> None:
        """The process is now in ``phase`` (named in the signal's log line); ``graceful``: a stop signal
        calls the stop callbacks instead of unwinding the main thread."""
        self.phase, self.graceful = phase, graceful and not self.harness
        if self.signals and self.graceful:  # asked to stop on the way here: take the graceful path now
            self._stop_callbacks()

    def run(self, main: Callable[[], int]) -> int:
        """``main()``'s exit code; unwound by a stop signal, the process ends by that signal."""
        try:
            code = main()
            self._returned = True
            return code
        except Terminated as exc:
            log.warning("stopped by %s while %s", exc.signal_name, self.phase)
            _die_by(exc.signum)
            raise  # not reached

    # --- the handler -----------------------------------------------------------------------------

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self._in_handler:  # a second signal while handling the first: the same request
            return
        self._in_handler = True
        try:
            with contextlib.suppress(OSError):  # the watchdog's own wake-up (if the wakeup fd was replaced)
                os.write(self._wake_w, bytes([signum]))
            name = signal.Signals(signum).name
            self.signals += 1
            first = self.signals == 1
            if first:
                self.first_signal_at = time.monotonic()
            shutdown.request(name)
            if self.harness:
                if not first:  # the cleanup is under way, and bounded: let it finish
                    log.warning("received %s again; still stopping the processes started here", name)
                    return
                log.warning("received %s: stopping every process started here", name, extra={"signal": name})
                raise Terminated(signum, name)
            if self._unwind:
                log.warning("still %s %g s after %s: unwinding now", self.phase, GRACEFUL_SHARE * self.grace_s,
                            name, extra={"signal": name, "phase": self.phase})
                raise Terminated(signum, name)
            if first and self.graceful:
                log.warning("received %s while %s: stopping gracefully (at most %g s)", name, self.phase,
                            self.grace_s, extra={"signal": name, "phase": self.phase})
                self._stop_callbacks()
                return
            log.warning("received %s while %s: stopping now", name, self.phase,
                        extra={"signal": name, "phase": self.phase, "signals": self.signals})
            raise Terminated(signum, name)
        finally:
            self._in_handler = False

    def _stop_callbacks(self) -> None:
        for callback in self._callbacks:
            callback()

    # --- the watchdog ----------------------------------------------------------------------------

    def _watch(self) -> None:
        deadline: float | None = None
        unwind_at: float | None = None  # when a graceful path still running is unwound
        signum = signal.SIGTERM
        while True:
            due = [t for t in (unwind_at, deadline) if t is not None]
            timeout = max(min(due) - time.monotonic(), 0.0) if due else None
            ready, _, _ = select.select([self._wake_r], [], [], timeout)
            if ready:
                try:
                    data = os.read(self._wake_r, 64)
                except BlockingIOError:
                    continue
                stops = [b for b in data if b in STOP_SIGNALS]
                if deadline is None and stops:
                    signum, now = signal.Signals(stops[0]), time.monotonic()
                    deadline, unwind_at = now + self.grace_s, now + GRACEFUL_SHARE * self.grace_s
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._expire(signum)
            if unwind_at is not None and now >= unwind_at:
                unwind_at = None
                if self.graceful and not self._returned:  # the handler unwinds the main thread on this signal
                    self._unwind = True
                    os.kill(os.getpid(), signum)

    def _expire(self, signum: int) -> None:
        """The grace period is over: say so and end the process now. Written straight to the stderr file
        descriptor, without blocking: the logging lock or a full pipe may be what holds the main thread."""
        name = signal.Signals(signum).name
        message = "still running %g s after %s (while %s): exiting now"
        record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, message, (self.grace_s, name, self.phase),
                                   None)
        handlers = logging.getLogger().handlers
        try:
            line = handlers[0].format(record) if handlers else record.getMessage()
        except Exception:  # the exit must happen whatever the formatter does
            line = record.getMessage()
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(2, False)
            os.write(2, (line + "\n").encode(errors="replace"))
        os._exit(128 + signum)


_current: Lifecycle | None = None


def install(process: str, *, harness: bool = False, grace_s: float | None = None) -> Lifecycle:
    """Handle SIGTERM and SIGINT for this process (from the main thread, before anything slow). The phase
    is ``"starting"``, without a graceful path, until :meth:`Lifecycle.enter` says otherwise. ``harness``:
    a process whose job is its children (the demo, the chaos suite): every phase unwinds, further signals
    are ignored while it stops them, and its grace period leaves them theirs."""
    global _current
    if grace_s is None:
        grace_s = config.stop_grace_s() + (HARNESS_EXTRA_S if harness else 0.0)
    life = Lifecycle(process, grace_s, harness=harness)
    with contextlib.suppress(ValueError):  # e.g. an embedding that owns the wakeup fd: the handler still wakes us
        signal.set_wakeup_fd(life._wake_w, warn_on_full_buffer=False)
    threading.Thread(target=life._watch, name="lifecycle-watchdog", daemon=True).start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, life._handle)
    _current = life
    return life


def enter(phase: str, *, graceful: bool = True) -> None:
    """:meth:`Lifecycle.enter` on the installed lifecycle; nothing when none is (a process object driven
    in-process, e.g. by a test)."""
    if _current is not None:
        _current.enter(phase, graceful=graceful)


def current() -> Lifecycle | None:
    return _current


def _die_by(signum: int) -> None:
    """End the process by ``signum`` with its default action, so its parent sees it ended by the signal."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal is blocked
