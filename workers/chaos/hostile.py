"""A hostile actor for the chaos suite: admitted (it holds the operator's admission secret and an actor's Redis
credentials, as a compromised actor host would), it heartbeats as ready on the version the trainer dispatches
on, claiming an absurd rate, and answers with forgeries only:

* its own leases with results the lease could not have produced (token ids outside the vocabulary, more
  tokens than ``max_new_tokens``), signed with its own key;
* the honest actors' leases (it reads their work streams) as if it were them, signed with its own key;
* hand-backs of the honest actors' leases, to take their work away.

It runs as a thread beside the cluster's real processes and counts what it sent."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

from aurora_store.bus import ControlPlane, Lease
from aurora_store.errors import AuroraError
from aurora_store.testing.members import Member
from workers.cluster import LocalCluster

#: Far past any vocabulary a test model has.
OUT_OF_VOCAB = 1 << 30


class HostileActor(threading.Thread):
    def __init__(self, cluster: LocalCluster, actor_id: str, region: str, victims: list[str]) -> None:
        super().__init__(daemon=True, name=f"hostile-{actor_id}")
        self.plane = ControlPlane(cluster.redis.url_for("actor"), cluster.spec.run)
        self.member = Member(actor_id, cluster.spec.run, secret=cluster.admission_secret)
        self.region = region
        self.victims = victims
        self.sent: Counter[str] = Counter()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self._cursors = {a: self.plane.latest_id(self.plane.keys.work(a)) for a in [actor_id, *victims]}
        self._event_cursors = {region: "0"}
        self._committed = -1  # nothing committed yet: the first dispatch is on version 0

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                self._beat()
                for actor_id in list(self._cursors):
                    for entry_id, lease in self.plane.read_work(actor_id, self._cursors[actor_id], block_ms=None):
                        self._cursors[actor_id] = entry_id
                        self._answer(actor_id, lease)
                self.stopped.wait(0.05)
        except AuroraError as exc:  # reported by the scenario
            self.error = exc

    def _beat(self) -> None:
        # Claim what makes an actor eligible for a dispatch (sched.allocation: active on its version, or on the
        # one before with it staged): active on the version after the newest commit, the one after that staged.
        # That covers the next dispatch and the one after it, so a beat that trails a dispatch (a loaded machine,
        # ~0.25 s steps) still leaves it eligible. The newest commit comes from the region's event stream: the
        # trainer's own state is announced once a step and trails its commit by one, and claiming that, the
        # actor was excluded from every step of a loaded run and never got a lease to forge.
        events, self._event_cursors = self.plane.read_event_batch(self._event_cursors, block_ms=None)
        for _, _, event in events:
            if event.kind == "commit":
                self._committed = max(self._committed, event.version)
        trainer = self.plane.trainer_state()
        if trainer is not None:
            self._committed = max(self._committed, trainer.committed)
        state = self.member.state(self._committed + 1, region=self.region, tokens_per_s=1e9)
        self.member.heartbeat(self.plane, dataclasses.replace(state, staged_version=self._committed + 2))

    def _answer(self, holder: str, lease: Lease) -> None:
        if holder == self.member.actor_id:
            n = lease.max_new_tokens
            out_of_vocab = [{"ids": [OUT_OF_VOCAB] * n, "logprobs": [-0.1] * n, "text": ""}] * lease.group_size
            too_long = [{"ids": [1] * (n + 1), "logprobs": [-0.1] * (n + 1), "text": ""}] * lease.group_size
            for body in (out_of_vocab, too_long):
                self.plane.send_result(self.member.result(lease, body))
                self.sent["bad_shape"] += 1
            return
        impostor = Member(holder, self.member.run, secret="", key=self.member.key)
        self.plane.send_result(impostor.result(lease))  # well-shaped, under the victim's id, with our key
        self.sent["impersonated"] += 1
        self.plane.send_result(impostor.hand_back(lease))
        self.sent["handed_back"] += 1

    def leave(self) -> None:
        """Stop, and deregister (so that the fleet's digest check covers the honest actors)."""
        self.stopped.set()
        self.join(timeout=10)
        self.plane.deregister_actor(self.member.actor_id, self.region)
        self.plane.close()
