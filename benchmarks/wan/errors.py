"""Errors of the WAN-emulation harness.

They derive from :class:`benchmarks.errors.BenchmarkError` and from the builtin a caller would naturally
catch, so a benchmark can ``except PermissionError`` to skip when it is not root.
"""

from __future__ import annotations

from benchmarks.errors import BenchmarkError


class WanError(BenchmarkError, RuntimeError):
    """Root of every error raised by the WAN harness."""


class NotRootError(WanError, PermissionError):
    """Network namespaces, TUN devices and qdiscs need root (CAP_SYS_ADMIN + CAP_NET_ADMIN)."""


class NetnsUnsupportedError(WanError, OSError):
    """The kernel or the container refuses network namespaces, TUN devices or ``ip`` is missing."""


class CommandError(WanError):
    """An ``ip``/``tc``/``sysctl`` command failed; carries the command line and its stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"command {' '.join(argv)!r} failed with exit status {returncode}: {stderr.strip()}")


class ForwarderError(WanError):
    """The userspace link forwarder failed to start, died, or did not answer."""
