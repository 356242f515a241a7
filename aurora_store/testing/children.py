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

A session of its own is also, on Linux with autogroups (the default on most distributions' kernels), a CPU
group of its own: the scheduler shares the cores between groups first and within a group second, so a child
in a new session would shed its starter's lowered priority (``nice``, the idle class) and compete at full
weight. :func:`keep_priority_in_session` gives the new session its starter's ``nice``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1
PARENT_DEATH_SIGNAL = signal.SIGTERM
AUTOGROUP_TRIES = 4
AUTOGROUP_RETRY_S = 0.11


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


def keep_priority_in_session(leader: int) -> None:
    """Give the session that ``leader`` leads the CPU priority of this process, if this one runs lowered.

    Without it, six busy idle-class processes of sessions of their own cut a 50 Mbit/s emulated link that a
    normal-priority process forwards to 36-42 Mbit/s; with their sessions at ``nice 19``, it kept its 47. A
    kernel without autogroups has no such file, and a session at the default priority needs nothing."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= 0:
        return
    for _ in range(AUTOGROUP_TRIES):
        try:
            with open(f"/proc/{leader}/autogroup", "w") as group:
                group.write(str(nice))
            return
        except BlockingIOError:  # EAGAIN: the kernel allows one change in 100 ms but to CAP_SYS_ADMIN
            time.sleep(AUTOGROUP_RETRY_S)
        except OSError:  # no autogroups, or the session already gone
            return


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` of ``argv`` in a new session at this process's priority, with the parent-death
    signal when started from the main thread (see the module docstring)."""
    if _PRCTL is not None and threading.current_thread() is threading.main_thread():
        kwargs["preexec_fn"] = _die_with(os.getpid())
    proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
    keep_priority_in_session(proc.pid)
    return proc
