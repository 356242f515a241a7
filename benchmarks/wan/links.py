"""The two ways to build a link between the home namespace and a remote one, behind one small interface.

* :class:`ForwarderLink`: a TUN device at each end and a userspace forwarder process between them, for delay,
  random loss and an in-network bottleneck (see :mod:`benchmarks.wan.forwarder`).
* :class:`VethLink`: a veth pair with a ``tbf`` qdisc per direction, for links without delay or loss, where the
  kernel path is cheaper and faster than any userspace forwarder.

Either way the link ends as interface ``home_if`` in the home namespace and ``remote_if`` in the remote one;
addresses and routes are the topology's business.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import threading
from dataclasses import dataclass, fields

from benchmarks.wan.errors import ForwarderError
from benchmarks.wan.ipcmd import ip, run_cmd, tc
from benchmarks.wan.spec import LinkSpec, Shape

FORWARDER_MODULE = "benchmarks.wan.forwarder"


@dataclass(frozen=True)
class DirectionStats:
    """Packet counters of one direction since start or the last reset.

    ``dropped_loss``: emulated random loss; ``dropped_queue``: tail drops of the bottleneck buffer (congestion);
    ``dropped_overrun``: packets the kernel dropped because the forwarder fell behind (TUN ring full) — if this
    is not ~0 the link is asked for more than the forwarder can carry and results are not trustworthy.
    """

    packets_in: int = 0
    bytes_in: int = 0
    packets_out: int = 0
    bytes_out: int = 0
    dropped_loss: int = 0
    dropped_queue: int = 0
    dropped_overrun: int = 0

    @classmethod
    def from_dict(cls, raw: dict[str, float]) -> DirectionStats:
        return cls(**{f.name: int(raw.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True)
class LinkStats:
    """Both directions of a link; ``down`` = home → remote, ``up`` = remote → home."""

    down: DirectionStats
    up: DirectionStats

    @property
    def packets_in(self) -> int:
        return self.down.packets_in + self.up.packets_in

    @property
    def dropped_loss(self) -> int:
        return self.down.dropped_loss + self.up.dropped_loss

    @property
    def loss_observed(self) -> float:
        """Random drops / packets offered to the wire (queue overflows excluded: they are congestion, not loss)."""
        wire = self.packets_in - self.down.dropped_queue - self.up.dropped_queue
        return self.dropped_loss / wire if wire else 0.0


class ForwarderLink:
    """A link emulated by a forwarder process holding a TUN device in each namespace."""

    def __init__(self, spec: LinkSpec, home_ns: str, home_if: str, remote_ns: str, remote_if: str,
                 run_id: str = "") -> None:
        self.spec = spec
        self.home_ns, self.home_if = home_ns, home_if
        self.remote_ns, self.remote_if = remote_ns, remote_if
        self.run_id = run_id
        self.proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._overrun_base = (0, 0)
        self.scheduling = ""
        """The forwarder's CPU scheduling class once started: ``realtime``, ``normal`` or ``inherited``."""

    def start(self, timeout: float = 15.0) -> None:
        """Spawn the forwarder and wait until both TUN devices exist."""
        argv = [
            sys.executable, "-m", FORWARDER_MODULE,
            "--ns-a", self.home_ns, "--tun-a", self.home_if,
            "--ns-b", self.remote_ns, "--tun-b", self.remote_if,
            "--ab", *self.spec.down.to_args(), "--ba", *self.spec.up.to_args(),
            "--seed", str(self.spec.seed), "--run-id", self.run_id,
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, start_new_session=True)
        word, _, scheduling = self._readline(timeout).strip().partition(" ")
        if word != "ready":
            err = self._stop_and_collect()
            raise ForwarderError(f"forwarder for {self.remote_ns} did not start: {word} {scheduling} {err}".strip())
        self.scheduling = scheduling

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stats(self) -> LinkStats:
        """Counters straight from the forwarder (drops by random loss and by a full buffer, per direction)."""
        raw = json.loads(self._command("stats"))
        if "error" in raw:
            raise ForwarderError(raw["error"])
        down = dict(raw["ab"], dropped_overrun=_tx_dropped(self.home_ns, self.home_if) - self._overrun_base[0])
        up = dict(raw["ba"], dropped_overrun=_tx_dropped(self.remote_ns, self.remote_if) - self._overrun_base[1])
        return LinkStats(down=DirectionStats.from_dict(down), up=DirectionStats.from_dict(up))

    def reset_stats(self) -> None:
        self._command("reset")
        self._overrun_base = (_tx_dropped(self.home_ns, self.home_if), _tx_dropped(self.remote_ns, self.remote_if))

    def reshape(self, spec: LinkSpec) -> None:
        """Change rate/delay/loss while connections stay up (the seed is kept from the start)."""
        self._command(f"set ab {spec.down.to_args()[0]}")
        self._command(f"set ba {spec.up.to_args()[0]}")
        self.spec = spec

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the forwarder to quit (closing its TUN devices removes them), kill it if it does not."""
        self._stop_and_collect(timeout)

    def _stop_and_collect(self, timeout: float = 5.0) -> str:
        proc = self.proc
        if proc is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()  # EOF = quit
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err = ""
        with contextlib.suppress(OSError, ValueError):
            err = proc.stderr.read()[-2000:]
        for stream in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        return err

    def _command(self, line: str, timeout: float = 5.0) -> str:
        with self._lock:
            if not self.alive():
                raise ForwarderError(f"forwarder for {self.remote_ns} is not running")
            try:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise ForwarderError(f"forwarder for {self.remote_ns} went away: {exc}") from exc
            return self._readline(timeout)

    def _readline(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise ForwarderError(f"forwarder for {self.remote_ns} did not answer within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise ForwarderError(f"forwarder for {self.remote_ns} exited (status {self.proc.poll()})")
        return line


class VethLink:
    """A veth pair with a tbf qdisc on each end's egress; no delay, no loss, kernel speed."""

    def __init__(self, spec: LinkSpec, home_ns: str, home_if: str, remote_ns: str, remote_if: str,
                 run_id: str = "") -> None:
        self.spec = spec
        self.home_ns, self.home_if = home_ns, home_if
        self.remote_ns, self.remote_if = remote_ns, remote_if

    pid = None

    def start(self) -> None:
        ip("link", "add", self.home_if, "netns", self.home_ns, "type", "veth",
           "peer", "name", self.remote_if, "netns", self.remote_ns)
        _tbf(self.home_ns, self.home_if, self.spec.down)
        _tbf(self.remote_ns, self.remote_if, self.spec.up)

    def alive(self) -> bool:
        return True

    def stats(self) -> LinkStats:
        """Packets sent by each end (kernel counters) and packets its tbf dropped for a full buffer."""
        return LinkStats(down=_veth_direction(self.home_ns, self.home_if),
                         up=_veth_direction(self.remote_ns, self.remote_if))

    def reset_stats(self) -> None:
        raise NotImplementedError("kernel counters of a veth link cannot be reset; take differences of stats()")

    def reshape(self, spec: LinkSpec) -> None:
        if not (spec.down.is_plain and spec.up.is_plain):
            raise ValueError("a veth link cannot emulate delay or loss")
        for ns, dev in ((self.home_ns, self.home_if), (self.remote_ns, self.remote_if)):
            run_cmd(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
        _tbf(self.home_ns, self.home_if, spec.down)
        _tbf(self.remote_ns, self.remote_if, spec.up)
        self.spec = spec

    def stop(self) -> None:
        ip("link", "del", self.home_if, netns=self.home_ns, check=False)


def _tbf(ns: str, dev: str, shape: Shape) -> None:
    """Shape egress with tbf: burst of ~1 ms of traffic (at least 32 KiB, so GSO bursts pass whole)."""
    if shape.rate_mbit is None:
        return
    rate_Bps = shape.rate_mbit * 1e6 / 8
    burst = max(32 * 1024, int(rate_Bps / 1000))
    limit = max(shape.effective_queue_bytes or 0, burst)
    tc("qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{shape.rate_mbit}mbit",
       "burst", str(burst), "limit", str(limit), netns=ns)


def _tx_stats(ns: str, dev: str) -> dict[str, int]:
    link = json.loads(ip("-j", "-s", "link", "show", "dev", dev, netns=ns).stdout)[0]
    return link.get("stats64", link.get("stats", {})).get("tx", {})


def _tx_dropped(ns: str, dev: str) -> int:
    """Kernel drops on a TUN device's transmit side: its ring was full because the forwarder lagged."""
    return int(_tx_stats(ns, dev).get("dropped", 0))


def _veth_direction(ns: str, dev: str) -> DirectionStats:
    tx = _tx_stats(ns, dev)
    qdiscs = json.loads(run_cmd(["ip", "netns", "exec", ns, "tc", "-j", "-s", "qdisc", "show", "dev", dev]).stdout)
    drops = sum(int(q.get("drops", 0)) for q in qdiscs)
    packets = int(tx.get("packets", 0))
    return DirectionStats(packets_in=packets + drops, bytes_in=int(tx.get("bytes", 0)), packets_out=packets,
                          bytes_out=int(tx.get("bytes", 0)), dropped_queue=drops)


def make_link(spec: LinkSpec, home_ns: str, home_if: str, remote_ns: str, remote_if: str,
              run_id: str = "") -> ForwarderLink | VethLink:
    """The cheapest link that can emulate ``spec``."""
    cls = ForwarderLink if spec.uses_forwarder else VethLink
    return cls(spec, home_ns, home_if, remote_ns, remote_if, run_id)
