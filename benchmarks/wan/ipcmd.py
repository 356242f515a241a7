"""Thin, checked wrappers around ``ip``, ``tc`` and ``sysctl`` so every failure names its command line."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from benchmarks.wan.errors import CommandError, NetnsUnsupportedError, NotRootError


def require_root() -> None:
    """Fail early with a typed error: half-built topologies from EPERM deep inside are hard to read."""
    if os.geteuid() != 0:
        raise NotRootError("the WAN harness needs root (network namespaces, TUN devices and qdiscs)")
    if shutil.which("ip") is None:
        raise NetnsUnsupportedError("the 'ip' command (iproute2) is not installed")


def run_cmd(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run one command, capturing output; raise :class:`CommandError` with its stderr when ``check``."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise CommandError(list(argv), proc.returncode, proc.stderr)
    return proc


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip [-n NETNS] ARGS…`` (``-n`` avoids a fork of ``ip netns exec`` for plain link/addr/route work)."""
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return run_cmd(argv, check=check)


def ip_batch(lines: Sequence[str], *, netns: str | None = None) -> None:
    """Many ``ip`` commands in one process (``ip -batch -``): topology setup stays fast with many regions."""
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise CommandError([*argv, "<<", *lines], proc.returncode, proc.stderr)


def tc(*args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    """``tc`` inside a namespace (through ``ip netns exec``, as tc has no ``-n`` in older iproute2)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return run_cmd([*prefix, "tc", *args])
