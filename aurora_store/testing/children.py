"""Child processes that do not outlive the process that started them: the one way the local servers
(:mod:`aurora_store.testing.servers`) and the local cluster's processes (``workers.launch``) are started.

Each child runs in a session of its own, so a terminal's Ctrl-C or a signal to the starter's process group
reaches only the starter, which then stops its children in order (actors before the Redis they deregister
from). That alone would orphan them whenever the starter ends without stopping them — SIGKILLed by a CI
timeout, an OOM kill, a crash — and an orphaned Valkey or actor runs on for hours. So each child also asks
Linux for a parent-death signal (``PR_SET_PDEATHSIG``): SIGTERM, which Aurora's processes honour in every
state (``workers.lifecycle``), the moment its starter is gone, however it went.

Linux sends that signal when the *thread* that forked the child ends, not the process. A child started
from any other thread than the main one (which lives as long as the process) would be stopped when that
thread returns, so only children started from the main thread are armed; the others rely on being stopped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1
PARENT_DEATH_SIGNAL = signal.SIGTERM


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # resolved here: the child, between fork and exec, must not load or import anything


def _die_with(parent: int) -> Callable[[], None]:
    def arm() -> None:  # runs in the child between fork and exec: plain calls only
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL))
        if os.getppid() != parent:  # the starter died before the signal was armed: nobody will send it
            os._exit(1)
    return arm


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` of ``argv`` in a new session, with the parent-death signal when started
    from the main thread (see the module docstring)."""
    if _PRCTL is not None and threading.current_thread() is threading.main_thread():
        kwargs["preexec_fn"] = _die_with(os.getpid())
    return subprocess.Popen(list(argv), start_new_session=True, **kwargs)
