"""Hub-and-spoke WAN topology: a home region and N remote regions, each behind its own emulated link.

Every region is a network namespace named ``aur-<pid>-<n>-<region>`` (``n`` counts topologies per process) with
one address in 198.18.0.0/15 (the benchmarking range, never routed on the Internet) on its loopback: home is
198.18.0.1, the k-th remote region 198.18.k.1. Remote regions reach home (and, through home, each other) over
their link; the routes carry ``congctl cubic`` so every TCP connection that crosses a link, active or accepted,
uses a loss-sensitive algorithm (see :mod:`benchmarks.wan.congestion`).

:class:`Topology` is a context manager that always tears down what it built (processes it started, anything
else running in its namespaces, forwarders, devices, namespaces), on normal exit, on exceptions, at
interpreter exit, and on SIGTERM/SIGINT delivered to the harness process.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType

from benchmarks.wan.congestion import DEFAULT_CC, route_options
from benchmarks.wan.errors import WanError
from benchmarks.wan.ipcmd import ip_batch, require_root
from benchmarks.wan.links import ForwarderLink, LinkStats, VethLink, make_link
from benchmarks.wan.netns import (
    DEFAULT_PREFIX,
    cleanup_stale,
    create_netns,
    delete_netns,
    entered,
    kill_netns_pids,
    run_prefix,
    sysctl,
)
from benchmarks.wan.spec import LinkSpec

HOME_ADDRESS = "198.18.0.1"
WAN_SUPERNET = "198.18.0.0/15"
MAX_REMOTES = 254
_SEQUENCE = itertools.count()
"""Numbers the topologies of one process, so nested or successive ones never share namespace names."""
TXQUEUELEN = 4096
"""TUN ring size: absorbs bursts while the forwarder is descheduled (the default 500 overflows on 2 cores)."""


@dataclass(frozen=True)
class Region:
    """A region as benchmarks see it: its namespace, its address, and (for remote ones) its link spec."""

    name: str
    netns: str
    address: str
    index: int
    link: LinkSpec | None = None


class Topology:
    """Build, use and always tear down a hub-and-spoke set of namespaces joined by emulated links.

    ``remotes`` maps remote-region names to their link to home, e.g.
    ``Topology({"eu": LinkSpec.symmetric(100, rtt_ms=50, loss=0.01)})``. ``congestion`` is the TCP algorithm
    pinned on routes over links (``None`` keeps the machine default). ``clean_stale`` first removes namespaces
    left behind by crashed earlier runs (those whose creating pid is gone).
    """

    def __init__(
        self,
        remotes: Mapping[str, LinkSpec],
        *,
        home: str = "home",
        congestion: str | None = DEFAULT_CC,
        base_prefix: str = DEFAULT_PREFIX,
        clean_stale: bool = True,
        handle_signals: bool = True,
    ) -> None:
        if home in remotes:
            raise ValueError(f"region name {home!r} is used for home and a remote region")
        if len(remotes) > MAX_REMOTES:
            raise ValueError(f"at most {MAX_REMOTES} remote regions fit the address plan, got {len(remotes)}")
        for name in (home, *remotes):
            if not name or not all(c.isalnum() or c in "-_" for c in name):
                raise ValueError(f"region names must be alphanumeric (with - and _), got {name!r}")
        self.prefix = f"{run_prefix(base=base_prefix)}{next(_SEQUENCE)}-"
        self.base_prefix = base_prefix
        self.congestion = congestion
        self.home = home
        self._regions: dict[str, Region] = {home: Region(home, self.prefix + home, HOME_ADDRESS, 0)}
        for k, (name, spec) in enumerate(remotes.items(), start=1):
            self._regions[name] = Region(name, self.prefix + name, f"198.18.{k}.1", k, spec)
        self._links: dict[str, ForwarderLink | VethLink] = {}
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._clean_stale = clean_stale
        self._handle_signals = handle_signals
        self._saved_handlers: dict[int, object] = {}
        self._pending_signal: int | None = None
        self._closing = False
        self._lock = threading.RLock()
        self._closed = False

    # --- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Topology:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> Topology:
        """Create namespaces, links, addresses and routes. On any failure, tears down what exists and re-raises."""
        if self._created or self._closed:
            raise WanError(f"topology {self.prefix}* was already started; build a new Topology to start again")
        require_root()
        if self._clean_stale:
            cleanup_stale(self.base_prefix)
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            for region in self._regions.values():
                create_netns(region.netns)
                self._created.append(region.netns)
                sysctl(region.netns, {"net.ipv6.conf.all.disable_ipv6": "1",
                                      "net.ipv6.conf.default.disable_ipv6": "1"})
            home = self._regions[self.home]
            sysctl(home.netns, {"net.ipv4.ip_forward": "1"})
            home_lines = [f"addr add {home.address}/32 dev lo"]
            for region in self.remotes:
                home_lines += self._build_link(region)
            ip_batch(home_lines, netns=home.netns)
        except BaseException:
            self.close()
            raise
        return self

    def _build_link(self, region: Region) -> list[str]:
        """Create the link of ``region``, configure its remote end; return the home end's ``ip`` commands."""
        assert region.link is not None
        home_if, remote_if = f"wan{region.index}", "wan0"
        link = make_link(region.link, self._regions[self.home].netns, home_if, region.netns, remote_if,
                         run_id=self.prefix)
        self._links[region.name] = link
        link.start()
        cc = " ".join(route_options(self.congestion))
        ip_batch([
            f"addr add {region.address}/32 dev lo",
            f"link set {remote_if} txqueuelen {TXQUEUELEN} up",
            f"route add {WAN_SUPERNET} dev {remote_if} src {region.address} {cc}".strip(),
        ], netns=region.netns)
        return [
            f"link set {home_if} txqueuelen {TXQUEUELEN} up",
            f"route add {region.address.rsplit('.', 1)[0]}.0/24 dev {home_if} src {HOME_ADDRESS} {cc}".strip(),
        ]

    def close(self) -> None:
        """Tear everything down; idempotent and safe to call from a signal handler or atexit."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
            errors: list[BaseException] = []
            for proc in self._procs:
                with _collect(errors):
                    _terminate_group(proc)
            for netns in self._created:
                with _collect(errors):
                    kill_netns_pids(netns)
            for link in self._links.values():
                with _collect(errors):
                    link.stop()
            for netns in reversed(self._created):
                with _collect(errors):
                    delete_netns(netns)
            self._restore_signal_handlers()
            self._closing = False
            with contextlib.suppress(Exception):
                atexit.unregister(self.close)
            if self._pending_signal is not None:  # a signal arrived mid-teardown: act on it now that we are done
                signum, self._pending_signal = self._pending_signal, None
                self._chain(signum, None)
            if errors:
                raise WanError(f"teardown of {self.prefix}* had {len(errors)} error(s): {errors[0]}") from errors[0]

    # --- signals ---------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._saved_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._saved_handlers.items():
            with contextlib.suppress(Exception):
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, handler)  # type: ignore[arg-type]

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Tear down first, then behave as the process would have without us (chain or exit).

        A second signal during teardown is held until teardown is complete, so it cannot interrupt it halfway.
        """
        if self._closing:
            self._pending_signal = signum
            return
        with contextlib.suppress(Exception):
            self.close()
        self._chain(signum, frame)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        previous = self._saved_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    # --- queries ---------------------------------------------------------------------------------

    @property
    def regions(self) -> list[Region]:
        """Home first, then the remote regions in the order given."""
        return list(self._regions.values())

    @property
    def remotes(self) -> list[Region]:
        return [r for r in self._regions.values() if r.link is not None]

    def region(self, name: str) -> Region:
        try:
            return self._regions[name]
        except KeyError:
            raise KeyError(f"no region {name!r}; regions are {list(self._regions)}") from None

    def address(self, region: str) -> str:
        """The IPv4 address by which other regions reach processes of ``region`` (bind 0.0.0.0 or this)."""
        return self.region(region).address

    def netns(self, region: str) -> str:
        """The namespace name (for ``ip netns exec`` or :func:`benchmarks.wan.netns.setns`)."""
        return self.region(region).netns

    def link(self, region: str) -> ForwarderLink | VethLink:
        """The link object of a remote region (stats, reset_stats, reshape)."""
        if region not in self._links:
            raise KeyError(f"region {region!r} has no link (home, or not a region)")
        return self._links[region]

    def link_stats(self, region: str) -> LinkStats:
        return self.link(region).stats()

    def forwarder_pids(self) -> list[int]:
        """Pids of the forwarder processes (to verify teardown)."""
        return [link.pid for link in self._links.values() if isinstance(link, ForwarderLink) and link.pid]

    # --- running things inside regions -------------------------------------------------------------

    def command(self, region: str, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside ``region`` (``ip netns exec`` execs it: same pid, same env)."""
        return ["ip", "netns", "exec", self.netns(region), *argv]

    def popen(self, region: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen:
        """Start a process inside ``region``; it is killed (with its process group) at teardown.

        ``env`` is the complete environment (``None`` = inherit). Other keyword arguments go to
        :class:`subprocess.Popen`; ``start_new_session`` defaults to True so teardown can kill the group.
        """
        self._check_open()
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(region, argv), env=dict(env) if env is not None else None,
                                **kwargs)  # type: ignore[call-overload]
        self._procs.append(proc)
        return proc

    def run(self, region: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            check: bool = True, timeout: float | None = None, **kwargs: object) -> subprocess.CompletedProcess:
        """Run a command inside ``region`` to completion (like :func:`subprocess.run`)."""
        self._check_open()
        return subprocess.run(self.command(region, argv), env=dict(env) if env is not None else None,
                              check=check, timeout=timeout, **kwargs)  # type: ignore[call-overload]

    @contextlib.contextmanager
    def inside(self, region: str) -> Iterator[None]:
        """Run a block of this thread inside ``region``: sockets created in it live there for good."""
        self._check_open()
        with entered(self.netns(region)):
            yield

    def _check_open(self) -> None:
        if self._closed:
            raise WanError(f"topology {self.prefix}* is closed")
        if not self._created:
            raise WanError("topology not started; use it as a context manager or call start()")


def _terminate_group(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    try:
        own_group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        own_group = False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def _collect(errors: list[BaseException]) -> Iterator[None]:
    """Keep tearing down after one step fails; the first error is reported at the end."""
    try:
        yield
    except Exception as exc:
        errors.append(exc)
