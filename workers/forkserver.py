"""Starting Aurora's processes from a warm interpreter: a fork server for suites that start hundreds of them.

Each trainer, actor or relay process spends its first 2–6 CPU-seconds importing torch, transformers and numba
before it runs a line of its own. A test suite that starts ~150 of them on a 2-core machine pays that again
and again. :class:`ForkServer` starts one *template* process (``python -m workers.forkserver``), which imports
those libraries once, compiles the codec's kernels once, and then forks a child per request. Each child then:

* gets its own session (``setsid``) and a parent-death signal, like :func:`aurora_store.testing.children.popen`
  children;
* gets the requested working directory, environment and log file on fds 1 and 2;
* runs ``runpy.run_module(module, run_name="__main__")`` exactly as ``python -m module`` would, and leaves
  through the interpreter's normal exit (non-daemon threads joined, ``atexit`` run).

The child is a real process with its own pid, signals and exit status. What it skips is interpreter
start-up and the template's imports. So a child is refused (started the usual way by the caller) when its
environment changes what those imports read: thread counts, ``PYTHON*``, ``LD_*``, library settings (see
:data:`IMPORT_TIME_ENV`). A child is also refused when it runs under a launcher (``torchrun``, ``taskset``).

The template is the child's parent, so it is the one that reaps the child. :class:`ForkedProcess` gives the
starter what :class:`subprocess.Popen` gives it:
* ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``;
* exit seen through a pidfd, without reaping. The pid stays reserved until :meth:`ForkedProcess.poll` asks
  the template to collect it, as with a real child (:class:`workers.launch.Managed` relies on that).

Used by the test suite only (:func:`workers.launch.start_from_template`, a choice of the pytest process that its
children do not inherit); ``make demo``, ``make chaos`` and real deployments start every process the usual way.
A child's ``ps`` command line is the template's; its name (``comm``, ``ps -o comm``) is its module's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import importlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from aurora_store.testing import children

#: What the template imports before it forks: the heavy libraries every trainer, actor and relay loads first.
PRELOAD = ("torch", "numpy", "numba", "transformers.models.qwen3.modeling_qwen3",
           "transformers.models.qwen3_moe.modeling_qwen3_moe", "aurora_store.codec", "aurora_store.store",
           "aurora_store.bus", "aurora_store.follow", "workers.trainer.trainer", "workers.actor.actor",
           "workers.actor.emulated", "workers.relay.relay", "workers.engines.torch_engine")

#: Modules a child may run (anything else is started the usual way).
MODULES = frozenset({"workers.trainer", "workers.actor", "workers.actor.emulated", "workers.relay"})

#: Environment variables that the template's imports (or the interpreter's start) have already read. A
#: child whose value of one of them differs from the template's would run with the wrong setting, so it is
#: refused.
IMPORT_TIME_ENV = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "NUMBA_", "TORCH", "PYTORCH_", "CUDA_",
                   "NVIDIA_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "MALLOC_")

#: Templates one starter keeps at most (one per distinct import-time environment its children ask for; each
#: holds ~0.3 GB of imported libraries).
MAX_TEMPLATES = 6

#: Set by the starter for every child; the template gives its children the same (unbuffered output) itself.
EMULATED_ENV = frozenset({"PYTHONUNBUFFERED"})

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_EXIT_WAIT_S = 0.05


class ForkServerError(RuntimeError):
    """The template process is gone or answered nonsense (the caller starts processes the usual way)."""


class ForkedProcess:
    """A child of the template, driven like :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``,
    ``send_signal``, ``kill``, ``terminate``, ``returncode``)."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def exited(self) -> bool:
        """Whether the process has exited, without collecting it (its pid stays reserved)."""
        if self.returncode is not None:
            return True
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self.exited():
            self.returncode = self.server.reap(self.pid)
            os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            select.select([self._pidfd], [], [], remaining)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # collected: the pid may be someone else's by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The starter's side: one template process, requests over its stdin/stdout, one at a time."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self.env = dict(os.environ if env is None else env)  # what the template's imports read
        self._process = children.popen([sys.executable, "-m", "workers.forkserver"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=self.env)
        #: CPU seconds (user + system) of the children collected so far and of all they waited for: what
        #: ``getrusage(RUSAGE_CHILDREN)`` would count had this process started them itself.
        self.children_cpu_s = 0.0
        self._request({"op": "ready"})

    def accepts(self, module: str, env: Mapping[str, str], prefix: Sequence[str] | None) -> bool:
        """Whether a child running ``module`` with ``env`` would run as if started the usual way."""
        if prefix or module not in MODULES or self._process.poll() is not None:
            return False
        keys = (set(env) | set(self.env)) - EMULATED_ENV
        return not any(key.startswith(IMPORT_TIME_ENV) and env.get(key) != self.env.get(key) for key in keys)

    def start(self, module: str, args: Sequence[str], *, env: Mapping[str, str], log_path: Path,
              cwd: Path | None = None) -> ForkedProcess:
        reply = self._request({"op": "spawn", "module": module, "args": list(args), "env": dict(env),
                               "log": str(log_path), "cwd": str(cwd or Path.cwd())})
        return ForkedProcess(self, int(reply["pid"]), [sys.executable, "-m", module, *args])

    def reap(self, pid: int) -> int:
        reply = self._request({"op": "reap", "pid": pid})
        self.children_cpu_s += float(reply["cpu_s"])
        return int(reply["returncode"])

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            try:
                stdin.write(json.dumps(message).encode() + b"\n")
                stdin.flush()
                line = stdout.readline()
            except (OSError, ValueError) as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
        if not line:
            raise ForkServerError(f"the fork server is gone (exit {self._process.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise ForkServerError(reply["error"])
        return reply


_SERVERS: dict[tuple[int, tuple[tuple[str, str], ...]], ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def import_time_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What of ``env`` the template's imports read (:data:`IMPORT_TIME_ENV`, less what it emulates)."""
    return tuple(sorted((key, value) for key, value in env.items()
                        if key.startswith(IMPORT_TIME_ENV) and key not in EMULATED_ENV))


def shared(env: Mapping[str, str] | None = None) -> ForkServer | None:
    """This process's fork server for children with ``env`` (default: ours), started on first use: one per
    distinct import-time environment (a test that sets, say, ``HF_HUB_OFFLINE`` in the suite's environment gets
    a template of its own rather than children that read the old value). ``None`` once :data:`MAX_TEMPLATES`
    are running and none fits."""
    wanted = import_time_env(os.environ if env is None else env)
    with _SERVERS_LOCK:
        key = (os.getpid(), wanted)
        server = _SERVERS.get(key)
        if server is None:
            if sum(pid == os.getpid() for pid, _ in _SERVERS) >= MAX_TEMPLATES:
                return None
            server = _SERVERS[key] = ForkServer(env)
            atexit.register(server.close)
        return server


def children_cpu_seconds() -> float:
    """CPU seconds of every child this process's fork servers have collected (see
    :attr:`ForkServer.children_cpu_s`); 0 without one."""
    return sum(server.children_cpu_s for (pid, _), server in list(_SERVERS.items()) if pid == os.getpid())


# --- the template process ---------------------------------------------------------------------------------


def _serve(requests: IO[bytes], replies: IO[bytes]) -> dict[str, Any] | None:
    """Answer requests until the starter closes the pipe (``None``). In a forked child, return its request."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    template = os.getpid()
    for line in requests:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            if request["op"] == "ready":
                reply = {"ok": True}
            elif request["op"] == "reap":
                _, status, usage = os.wait4(int(request["pid"]), 0)
                reply = {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}
            elif request["op"] == "spawn":
                ready, told = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(ready)
                    _become_child(request, libc, template, told)
                    return request
                os.close(told)
                # answered once the child has its own session: a signal to its group must not miss it
                with os.fdopen(ready, "rb") as pipe:
                    pipe.read()
                reply = {"pid": pid}
            else:
                reply = {"error": f"unknown request {request['op']!r}"}
        except (OSError, KeyError, ValueError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()
    return None


def _become_child(request: dict[str, Any], libc: ctypes.CDLL, template: int, told: int) -> None:
    """In the forked child: a session of its own, the parent-death signal, the log on fds 1 and 2, the
    requested directory and environment, fresh random state: what ``python -m`` would have started with."""
    os.setsid()
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(request["module"].encode()[-15:]))
    libc.prctl(_PR_SET_PDEATHSIG, int(children.PARENT_DEATH_SIGNAL))
    if os.getppid() != template:  # the template died before the signal was armed
        os._exit(1)
    os.close(told)  # the template answers the starter now
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED, as the usual start gives every child
        stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _compile_kernels() -> None:
    """The codec's kernels, compiled once here (or loaded from numba's on-disk cache) rather than in each child
    that encodes, digests or stages: ~0.5 CPU-s a child with a warm cache, 5-7 s each on a fresh checkout, where
    the first children would all compile at once. On one thread only: a thread pool started here would be
    missing from every child, which would wait on it forever."""
    from aurora_store.codec.warm import warm_kernels

    warm_kernels(threads=(1,))


def main() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _compile_kernels()
    request = _serve(sys.stdin.buffer, sys.stdout.buffer)
    if request is None:
        return
    import runpy

    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
