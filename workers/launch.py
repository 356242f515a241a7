"""Starting Aurora's processes as real subprocesses (for the demo, the tests and the chaos suite).

Each process gets its own log file and session (its process group is its own), and ends with its starter
even if that one is SIGKILLed (:mod:`aurora_store.testing.children`). :class:`ProcessGroup` stops them all on
exit: SIGTERM to each, time for their graceful path (:func:`aurora_store.config.stop_grace_s`, which their
own watchdog enforces), then SIGKILL to the whole process group of any that is left; what a process leaves
behind in its group when it exits (e.g. torchrun's ranks, an engine's workers) is stopped with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aurora_store import config
from aurora_store.testing import children
from workers import forkserver

#: Beyond the children's grace period: the interpreter's own exit after their graceful path.
EXIT_SLACK_S = 5.0


def stop_timeout_s() -> float:
    """How long a stopped child is given before it is killed."""
    return config.stop_grace_s() + EXIT_SLACK_S


_FROM_TEMPLATE = False


def start_from_template(enabled: bool = True) -> None:
    """Start this process's trainers, actors and relays from one warm template process
    (:mod:`workers.forkserver`) instead of a fresh interpreter each. A choice of this process only (the test
    suite makes it): its children, and anything they start, start the usual way."""
    global _FROM_TEMPLATE
    _FROM_TEMPLATE = enabled


@dataclass
class Managed:
    name: str
    argv: list[str]
    process: subprocess.Popen | forkserver.ForkedProcess
    log_path: Path
    log_offset: int = 0  # where this process's output starts in its log (a restart appends to the last one's)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, timeout: float | None = None) -> int | None:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            self.finish(time.monotonic() + (stop_timeout_s() if timeout is None else timeout))
        return self.process.returncode

    def kill(self) -> None:
        if self.alive:
            self._kill_group()
            self.process.wait(timeout=10)

    def finish(self, deadline: float) -> None:
        """After a SIGTERM: wait until ``deadline`` for the process to exit, kill its group if it has not, and
        collect its exit status."""
        while not self._exited():
            if time.monotonic() >= deadline:
                self._kill_group()
                break
            time.sleep(0.05)
        else:
            # Exited but not collected: its pid still names its process group and cannot have been reused,
            # so whatever it left in the group (and only that) is stopped here.
            self._kill_group()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def _exited(self) -> bool:
        """Whether the process has exited, without collecting it (``WNOWAIT``)."""
        if self.process.returncode is not None:
            return True
        if isinstance(self.process, forkserver.ForkedProcess):  # the fork server's child, not ours
            return self.process.exited()
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # collected elsewhere
            return self.process.poll() is not None

    def _kill_group(self) -> None:
        if self.process.returncode is not None:  # collected: its pid may name someone else's group by now
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the group is the process and its own
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def log_lines(self) -> Iterator[str]:
        """The lines this process (not an earlier one of the same name) has written to its log so far, read
        as they are consumed."""
        try:
            log = open(self.log_path, "rb")  # noqa: SIM115 (closed by the with below)
        except OSError:
            return
        with log:
            log.seek(self.log_offset)
            for line in log:
                yield line.decode(errors="replace").rstrip("\n")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, Managed] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, args: list[str], *, env: dict[str, str] | None = None,
              prefix: list[str] | None = None) -> Managed:
        argv = [*(prefix or []), sys.executable, "-m", module, *args]
        log_path = self.log_dir / f"{name}.log"
        environment = {**os.environ, **self.env, **(env or {}), "PYTHONUNBUFFERED": "1"}
        offset = log_path.stat().st_size if log_path.exists() else 0
        process: subprocess.Popen | forkserver.ForkedProcess | None = self._forked(module, args, environment,
                                                                                    log_path, prefix)
        if process is None:
            with open(log_path, "ab") as log:
                process = children.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
        managed = Managed(name, argv, process, log_path, offset)
        self.processes[name] = managed
        return managed

    @staticmethod
    def _forked(module: str, args: list[str], env: dict[str, str], log_path: Path,
                prefix: list[str] | None) -> forkserver.ForkedProcess | None:
        """The process forked from the warm template, when this process asked for it
        (:func:`start_from_template`) and the template can run it as a fresh interpreter would (else ``None``:
        started the usual way)."""
        if not _FROM_TEMPLATE:
            return None
        try:
            server = forkserver.shared(env)
            if server is None or not server.accepts(module, env, prefix):
                return None
            return server.start(module, args, env=env, log_path=log_path)
        except forkserver.ForkServerError:
            return None

    def __getitem__(self, name: str) -> Managed:
        return self.processes[name]

    def stop_all(self, timeout: float | None = None) -> None:
        """SIGTERM to every live process at once, then each is given until one shared deadline."""
        stopping = [managed for managed in self.processes.values() if managed.alive]
        for managed in stopping:
            with contextlib.suppress(ProcessLookupError):
                managed.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + (stop_timeout_s() if timeout is None else timeout)
        for managed in stopping:
            managed.finish(deadline)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
