"""What an emulated link looks like: rate, one-way delay, random loss and buffer, per direction.

Kept free of any system calls so benchmarks can build, print and compare specs on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_QUEUE_BYTES = 64 * 1024
"""Floor for the bottleneck buffer: a few dozen full-size packets, so tiny BDPs still absorb TCP bursts."""


@dataclass(frozen=True)
class Shape:
    """One direction of a link.

    ``rate_mbit`` is the bottleneck rate (``None`` = as fast as the forwarder goes), ``delay_ms`` the one-way
    propagation delay (RTT = delay of both directions together), ``loss`` the probability that a packet is
    dropped at random (independent, Bernoulli), and ``queue_bytes`` the bottleneck buffer: packets that would
    wait longer than it holds are tail-dropped like on a router. By default the buffer is one bandwidth-delay
    product of the link (``rate × (2 × delay)``, at least :data:`MIN_QUEUE_BYTES`), the classic router sizing
    that lets a single loss-free TCP flow fill the pipe.
    """

    rate_mbit: float | None = None
    delay_ms: float = 0.0
    loss: float = 0.0
    queue_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be positive or None, got {self.rate_mbit}")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        if self.queue_bytes is not None and self.queue_bytes < 1500:
            raise ValueError(f"queue_bytes must hold at least one packet, got {self.queue_bytes}")

    @property
    def effective_queue_bytes(self) -> int | None:
        """Buffer size in bytes, or ``None`` when the direction is not rate-limited (no queue builds up)."""
        if self.rate_mbit is None:
            return None
        if self.queue_bytes is not None:
            return self.queue_bytes
        bdp = self.rate_mbit * 1e6 / 8 * (2 * self.delay_ms / 1000)
        return max(MIN_QUEUE_BYTES, int(bdp))

    @property
    def is_plain(self) -> bool:
        """True when the kernel alone can emulate it (no delay, no loss): a veth pair + tbf is enough."""
        return self.delay_ms == 0 and self.loss == 0

    def to_args(self) -> list[str]:
        """The forwarder's command-line form (``rate_mbit,delay_ms,loss,queue_bytes``; 0 = unlimited)."""
        return [f"{self.rate_mbit or 0},{self.delay_ms},{self.loss},{self.effective_queue_bytes or 0}"]


@dataclass(frozen=True)
class LinkSpec:
    """A link between the home region and one remote region: ``down`` = home → remote, ``up`` = remote → home.

    ``seed`` makes random loss reproducible (each direction draws from its own generator derived from it).
    ``backend`` picks how the link is built: ``"auto"`` uses a veth pair + tbf when neither direction has delay
    or loss (cheapest, kernel speed), else the userspace TUN forwarder; ``"forwarder"`` forces the forwarder
    (for example to read its packet counters).
    """

    down: Shape = field(default_factory=Shape)
    up: Shape = field(default_factory=Shape)
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "forwarder", "veth"):
            raise ValueError(f"backend must be 'auto', 'forwarder' or 'veth', got {self.backend!r}")
        if self.backend == "veth" and not (self.down.is_plain and self.up.is_plain):
            raise ValueError("a veth link cannot emulate delay or loss; use backend='forwarder'")

    @classmethod
    def symmetric(
        cls,
        rate_mbit: float | None = None,
        rtt_ms: float = 0.0,
        loss: float = 0.0,
        *,
        queue_bytes: int | None = None,
        seed: int = 0,
        backend: str = "auto",
    ) -> LinkSpec:
        """The usual WAN description: same rate both ways, half the RTT each way, ``loss`` in each direction."""
        shape = Shape(rate_mbit=rate_mbit, delay_ms=rtt_ms / 2, loss=loss, queue_bytes=queue_bytes)
        return cls(down=shape, up=shape, seed=seed, backend=backend)

    @property
    def uses_forwarder(self) -> bool:
        """Whether this link is built with the userspace TUN forwarder (vs. a veth pair)."""
        if self.backend == "auto":
            return not (self.down.is_plain and self.up.is_plain)
        return self.backend == "forwarder"

    @property
    def rtt_ms(self) -> float:
        """Propagation round-trip time (without queueing)."""
        return self.down.delay_ms + self.up.delay_ms
