"""Starting Aurora's processes as real subprocesses (for the demo, the tests and the chaos suite).

Each process gets its own log file; :class:`ProcessGroup` stops them all (SIGTERM, then SIGKILL) on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Managed:
    name: str
    argv: list[str]
    process: subprocess.Popen
    log_path: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, timeout: float = 20.0) -> int | None:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait(timeout=10)

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
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                       start_new_session=True)
        managed = Managed(name, argv, process, log_path)
        self.processes[name] = managed
        return managed

    def __getitem__(self, name: str) -> Managed:
        return self.processes[name]

    def stop_all(self, timeout: float = 20.0) -> None:
        for managed in self.processes.values():
            if managed.alive:
                managed.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for managed in self.processes.values():
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                managed.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                managed.kill()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
