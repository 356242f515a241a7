"""Network namespaces: create, enter, list, and delete them, including stale ones from crashed runs.

Names carry the creating process id (``aur-<pid>-…``) so a later run can tell a namespace left by a
crashed harness (its pid is gone) from one that a concurrent run still uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.wan.errors import NetnsUnsupportedError, WanError
from benchmarks.wan.ipcmd import ip, run_cmd

NETNS_DIR = Path("/var/run/netns")
DEFAULT_PREFIX = "aur-"
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def run_prefix(pid: int | None = None, base: str = DEFAULT_PREFIX) -> str:
    """The per-run namespace prefix, ``aur-<pid>-``: unique among live processes, parseable after a crash."""
    return f"{base}{os.getpid() if pid is None else pid}-"


def owner_pid(name: str, base: str = DEFAULT_PREFIX) -> int | None:
    """The pid encoded in a harness namespace name, or ``None`` when the name is not one of ours."""
    if not name.startswith(base):
        return None
    pid, sep, rest = name[len(base):].partition("-")
    return int(pid) if sep and rest and pid.isdigit() else None


def unsupported_reason(purpose: str = "the WAN benchmark") -> str | None:
    """Why network namespaces with TUN devices cannot be used here, or None when they can (probed for real:
    a namespace is created and deleted)."""
    if os.geteuid() != 0:
        return f"{purpose} needs root (network namespaces, TUN devices)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TUN support)"
    probe = f"{DEFAULT_PREFIX}{os.getpid()}-probe"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if added.returncode != 0:
        return f"network namespaces unsupported here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def list_netns() -> list[str]:
    """Names of all named network namespaces (those ``ip netns`` knows)."""
    out = ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def create_netns(name: str) -> None:
    """Create a namespace and bring its loopback up (services bound to 127.0.0.1 inside it must work)."""
    try:
        ip("netns", "add", name)
    except WanError as exc:
        raise NetnsUnsupportedError(f"cannot create network namespace {name!r}: {exc}") from exc
    ip("link", "set", "lo", "up", netns=name)


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (they keep it alive after ``ip netns del``)."""
    proc = run_cmd(["ip", "netns", "pids", name], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def kill_netns_pids(name: str, grace_s: float = 2.0) -> None:
    """SIGTERM every process in the namespace, then SIGKILL the ones still there after ``grace_s``."""
    pids = [p for p in netns_pids(name) if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if pids:
                time.sleep(0.02)
        if not pids:
            return


def delete_netns(name: str) -> None:
    """Kill what runs inside, then delete the namespace (its devices, addresses and routes go with it)."""
    kill_netns_pids(name)
    ip("netns", "del", name, check=False)


def cleanup_stale(base: str = DEFAULT_PREFIX, *, include_live: bool = False) -> list[str]:
    """Remove what crashed runs left: namespaces named ``<base><pid>-…`` whose creating process is gone (after
    killing the processes inside them) and forwarders whose owner is gone. Returns the namespaces removed.

    With ``include_live`` also those of live processes (only for a machine you know is otherwise idle).
    Forwarders normally die with their parent (parent-death signal + stdin EOF); the sweep is a safety net.
    """
    kill_stale_forwarders(base, include_live=include_live)
    removed = []
    for name in list_netns():
        if not name.startswith(base):
            continue
        pid = owner_pid(name, base)
        if pid is None or (_alive(pid) and not include_live):
            continue
        delete_netns(name)
        removed.append(name)
    return removed


def sysctl(name: str, settings: dict[str, str]) -> None:
    """Write per-namespace sysctls of namespace ``name``.

    ``/proc/sys/net`` resolves to the namespace of the thread that opens it, so entering the namespace is enough;
    no ``sysctl`` binary (procps) is needed on the machine.
    """
    with entered(name):
        for key, value in settings.items():
            Path("/proc/sys", *key.split(".")).write_text(f"{value}\n")


def kill_stale_forwarders(base: str = DEFAULT_PREFIX, *, include_live: bool = False) -> list[int]:
    """SIGKILL forwarder processes whose ``--run-id`` names a dead harness pid; returns their pids."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"benchmarks.wan.forwarder" not in argv or b"--run-id" not in argv:
            continue
        run_id = argv[argv.index(b"--run-id") + 1].decode(errors="replace") if argv[-1] != b"--run-id" else ""
        pid = owner_pid(run_id + "x", base)
        if pid is None or (_alive(pid) and not include_live):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
    return killed


def setns(name: str) -> None:
    """Move the calling thread into namespace ``name`` (file descriptors opened before stay where they are)."""
    path = NETNS_DIR / name
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns_fd(fd)
    finally:
        os.close(fd)


def _setns_fd(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run a block inside namespace ``name`` and return to the original one afterwards, even on error."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(name)
        try:
            yield
        finally:
            _setns_fd(home)
    finally:
        os.close(home)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
