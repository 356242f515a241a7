"""The actor's leases: per-prompt work granted on its work stream, queued until a batch on their version, and
handed back when they cannot be generated (their step is over, or the actor leaves)."""

from __future__ import annotations

from collections import deque

from aurora_store.bus import ControlPlane, Lease, RolloutResult
from aurora_store.bus.identity import ActorKey
from workers.actor.versions import VersionView


class LeaseQueue:
    def __init__(self, plane: ControlPlane, actor_id: str, view: VersionView, key: ActorKey) -> None:
        self.plane = plane
        self.actor_id = actor_id
        self.view = view
        self.key = key  # signs every result and hand-back: the trainer bound this key to our leases
        self._queue: deque[Lease] = deque()
        self._cursor: str | None = None  # last entry read from the work stream (set once registered)

    def __len__(self) -> int:
        return len(self._queue)

    def open(self) -> None:
        """Start reading the work stream from now on (just before registering: nothing older is ours)."""
        self._cursor = self.plane.latest_id(self.plane.keys.work(self.actor_id))

    def pull(self, block_ms: int | None) -> None:
        if self._cursor is None:
            return
        for entry_id, lease in self.plane.read_work(self.actor_id, self._cursor, block_ms=block_ms):
            self._cursor = entry_id
            self._queue.append(lease)
            with self.view.changed:  # a lease on v implies v is published and committed
                if lease.version > self.view.known_latest:
                    self.view.known_latest = lease.version
                    self.view.changed.notify_all()

    def demanded(self) -> int:
        """The newest version a queued lease asks for (-1: none)."""
        return max((lease.version for lease in self._queue), default=-1)

    def batch(self, active: int, size: int) -> list[Lease]:
        """Take up to ``size`` leases on the ``active`` version; leases on older versions are handed back
        (their step is over: the trainer only moves on once a batch is complete)."""
        obsolete = [lease for lease in self._queue if lease.version < active]
        if obsolete:
            self._queue = deque(lease for lease in self._queue if lease.version >= active)
            self.give_back(obsolete)
        batch = [lease for lease in self._queue if lease.version == active][:size]
        for lease in batch:
            self._queue.remove(lease)
        return batch

    def give_back(self, leases: list[Lease]) -> None:
        for lease in leases:
            self.send(RolloutResult("return", lease.lease_id, self.actor_id, ""))

    def send(self, result: RolloutResult) -> None:
        """Sign ``result`` with this actor's key and send it."""
        self.plane.send_result(self.key.signed(self.plane.run, result))

    def return_pending(self) -> int:
        """Hand back every lease granted and not generated: queued ones and any still unread in the work stream
        (granted while the last batch was generating). Returns how many."""
        self.pull(block_ms=None)
        pending = list(self._queue)
        self._queue.clear()
        self.give_back(pending)
        return len(pending)
