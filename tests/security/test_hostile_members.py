"""Hostile members against a running trainer: real trainer and actor processes, real Valkey with per-role ACL
users, real buckets. The attacker holds an actor's Redis credentials (every actor host has them) and, where
said, the operator's admission secret too (a hostile admitted host). It reads the honest actor's leases
(allowed: leases are not secret) and answers, hands back and floods as it likes; the run must complete, no
result of the attacker's be accepted, and the trainer's memory stay bounded.

Attacks (each counted by the trainer under its reason, asserted below):

* impersonation: results for the honest actor's leases, under its id, signed by another key → ``bad_signature``
* forged hand-backs of the honest actor's leases → not re-pooled (``stale_return``)
* oversized results (far more samples than the lease allows) → ``oversized``, never parsed
* a missing or ill-typed field → ``malformed``, the trainer goes on
* huge messages (7 MB each, a burst) → refused before parsing, trainer's peak memory grows far less than
  parsing them would cost; above the server's bulk limit (8 MB) the server itself refuses them
* a registration without the admission secret → never granted anything (``unadmitted``)
* an admitted actor claiming 10⁹ tokens/s that never answers → a probation share, then probed only every few
  steps; nothing it claims is measured
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis

from aurora_store.bus import ControlPlane, Lease, RolloutResult
from aurora_store.bus.identity import ActorKey, Credentials
from aurora_store.bus.messages import result_cap
from aurora_store.testing.members import Member
from workers.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.redis

STEPS, BATCH, GROUP = 8, 8, 2
HONEST, SILENT, UNADMITTED = "us-east-1", "boaster", "gatecrasher"
HUGE = 7 * 1024 * 1024  # under the server's 8 MB bulk limit: what reaches the trainer


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


class Attacker(threading.Thread):
    """Everything below runs with the actor role's Redis credentials only."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.plane = ControlPlane(cluster.redis.url_for("actor"), cluster.spec.run)
        self.run_name = cluster.spec.run
        self.stop = threading.Event()
        self.sent: dict[str, int] = {"impersonated": 0, "handed_back": 0, "oversized": 0, "malformed": 0,
                                     "huge": 0}
        self.peak_before: int | None = None
        self.peak_after: int | None = None
        self.error: BaseException | None = None
        self.boaster = Member(SILENT, self.run_name, secret=cluster.admission_secret)
        self.impostor_key = ActorKey.generate()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _beat(self) -> None:
        """The boaster: admitted, always ready on the trainer's version, claiming 10⁹ tokens/s, never working.
        The gatecrasher: the same without the admission secret."""
        trainer = self.plane.trainer_state()
        version = trainer.version if trainer is not None else 0
        self.boaster.heartbeat(self.plane, self.boaster.state(version, region="us-east", tokens_per_s=1e9))
        crasher = Member(UNADMITTED, self.run_name, secret="not-the-admission-secret")
        self.plane.heartbeat_actor(crasher.state(version, region="us-east", tokens_per_s=1e9),
                                   Credentials(crasher.key.public, "0" * 64))

    def _run(self) -> None:
        cursor = "0"
        seen: set[str] = set()
        trainer_pid = self.cluster.trainer().process.pid
        while not self.stop.is_set():
            self._beat()
            for entry_id, lease in self.plane.read_work(HONEST, cursor, block_ms=300):
                cursor = entry_id
                if lease.lease_id not in seen:
                    seen.add(lease.lease_id)
                    self._attack(lease, trainer_pid)

    def _send_raw(self, fields: dict[str, str]) -> None:
        self.plane.call(lambda r: r.xadd(self.plane.keys.results, fields))

    def _attack(self, lease: Lease, trainer_pid: int) -> None:
        impostor = Member(HONEST, self.run_name, secret="", key=self.impostor_key)
        # Impersonation: a well-shaped answer under the honest actor's id, with another key.
        self.plane.send_result(impostor.result(lease))
        self.sent["impersonated"] += 1
        # A forged hand-back would take the prompt away from the honest actor.
        self.plane.send_result(impostor.hand_back(lease))
        self.sent["handed_back"] += 1
        # Oversized: far more tokens than the lease allows (the admitted boaster's own key: only the size is wrong).
        big = [{"ids": [1] * lease.result_cap, "logprobs": [-0.1] * lease.result_cap, "text": ""}] * lease.group_size
        self.plane.send_result(self.boaster.key.signed(self.run_name, RolloutResult(
            "result", lease.lease_id, SILENT, "", lease.version, lease.weights_digest, 0, 0.1, big)))
        self.sent["oversized"] += 1
        # Malformed: a missing field, then an ill-typed one.
        good = impostor.result(lease).to_fields()
        self._send_raw({k: v for k, v in good.items() if k != "samples"} | {"samples": "[{\"ids\": 3}"})
        self._send_raw({k: v for k, v in good.items() if k != "lease_id"})
        self._send_raw(good | {"version": "NaN"})
        self.sent["malformed"] += 3
        if self.sent["huge"] == 0:  # once: a burst of huge messages, the trainer's peak memory around it
            self.peak_before = peak_rss_kib(trainer_pid)
            body = json.dumps([{"ids": [1] * (HUGE // 4), "logprobs": [], "text": ""}])[:HUGE]
            for _ in range(6):
                self._send_raw(good | {"samples": body})
                self.sent["huge"] += 1
            time.sleep(3)  # several pumps of the trainer
            self.peak_after = peak_rss_kib(trainer_pid)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    spec = ClusterSpec(run_dir=root, steps=STEPS, batch_size=BATCH, group_size=GROUP, actors={"us-east": 1},
                       snapshot_every=100, trainer_args=["--warm-start-steps", "0", "--epochs", "1",
                                                         "--initial-lease-s", "5", "--lease-factor", "4"])
    with LocalCluster(spec) as cluster:
        attacker = Attacker(cluster)
        cluster.wait_for(lambda: cluster.trainer_version() >= 0, 300, "the trainer's first version")
        attacker.start()
        try:
            summary = cluster.wait_trainer_done(600)
        finally:
            attacker.stop.set()
            attacker.join(timeout=30)
        yield {"cluster": cluster, "summary": summary, "log": cluster.plane.run_log(), "attacker": attacker}


def settles(log, **match):
    return [e for e in log if e["kind"] == "settle" and all(e.get(k) == v for k, v in match.items())]


def test_the_run_completes_and_only_the_honest_actor_is_ever_accepted(attacked):
    assert attacked["attacker"].error is None, attacked["attacker"].error
    log = attacked["log"]
    accepted = settles(log, accepted="1")
    assert accepted and {e["actor"] for e in accepted} == {HONEST}
    steps = [e for e in log if e["kind"] == "step"]
    assert len(steps) == STEPS


def test_impersonated_results_are_refused_by_signature(attacked):
    sent = attacked["attacker"].sent
    assert sent["impersonated"] > 0
    # every forged answer that reached a live ledger was refused (later ones are stale: their step was over)
    refused = settles(attacked["log"], reason="bad_signature")
    assert refused and all(e["actor"] == HONEST and e["accepted"] == "0" for e in refused)


def test_oversized_and_malformed_results_are_counted_and_never_kill_the_trainer(attacked):
    log = attacked["log"]
    assert settles(log, reason="oversized") and settles(log, reason="malformed")
    assert attacked["cluster"].trainer().process.returncode == 0


def test_a_burst_of_huge_messages_costs_the_trainer_bounded_memory(attacked):
    attacker = attacked["attacker"]
    assert attacker.sent["huge"] == 6 and attacker.peak_before and attacker.peak_after
    grown_mib = (attacker.peak_after - attacker.peak_before) / 1024
    print(json.dumps({"huge_messages": attacker.sent["huge"], "message_mib": HUGE / 2**20,
                      "trainer_peak_growth_mib": round(grown_mib, 1)}))
    # Parsing one of them would cost ~40× its 7 MB (~280 MiB, the burst ~1.6 GiB); refused unparsed, the burst
    # costs its raw bytes and the client's read buffers (and whatever the trainer itself did meanwhile).
    assert grown_mib < 200, f"trainer peak memory grew {grown_mib:.0f} MiB"


def test_the_server_refuses_a_field_larger_than_its_bulk_limit(attacked):
    client = redis.Redis.from_url(attacked["cluster"].redis.url_for("actor"))
    with pytest.raises((redis.ResponseError, redis.ConnectionError)):
        client.xadd(f"aurora:{attacked['cluster'].spec.run}:results", {"samples": "x" * (9 * 1024 * 1024)})
    client.close()


def test_actor_credentials_cannot_read_other_actors_or_write_the_trainers_keys(attacked):
    cluster = attacked["cluster"]
    keys = cluster.plane.keys
    actor = redis.Redis.from_url(cluster.redis.url_for("actor"))
    denied = {
        "read another actor's registration": lambda: actor.hgetall(keys.actor(HONEST)),
        "list the actors": lambda: actor.smembers(keys.actors),
        "read the results": lambda: actor.xrange(keys.results),
        "consume the trainer's results": lambda: actor.xreadgroup("trainer", "x", {keys.results: ">"}),
        "acknowledge results": lambda: actor.xack(keys.results, "trainer", "0-1"),
        "write version events": lambda: actor.xadd(keys.events("us-east"), {"kind": "commit", "version": "99"}),
        "grant leases": lambda: actor.xadd(keys.work(HONEST), {"lease_id": "0" * 32}),
        "write the trainer's state": lambda: actor.hset(keys.trainer, "version", "99"),
        "enumerate keys": lambda: actor.keys("*"),
        "wipe the server": lambda: actor.flushall(),
    }
    for what, attempt in denied.items():
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
            pytest.fail(f"an actor's credentials could {what}")
    assert actor.xrevrange(keys.work(HONEST), count=1) is not None  # what an actor needs still works
    actor.close()


def test_unadmitted_registrations_get_nothing_and_a_boaster_gets_probation_then_backoff(attacked):
    dispatches = [e for e in attacked["log"] if e["kind"] == "dispatch"]
    shares = [json.loads(e["shares"]) for e in dispatches]
    assert all(UNADMITTED not in s for s in shares)  # never admitted, never granted
    boasted = [s.get(SILENT, 0) for s in shares]
    # Beside the honest actor it never gets more than an equal share before anything is measured, and once the
    # honest actor is measured no more than a probation share (half an equal share), whatever it claims.
    both = [s for s in shares if HONEST in s]
    assert both and all(s.get(SILENT, 0) <= BATCH // 2 for s in both)
    assert all(s.get(SILENT, 0) <= BATCH // 4 for s in both[1:]), both
    # its leases expire every time it is granted: after two strikes it is probed only every 4th step
    granted_steps = [i for i, n in enumerate(boasted) if n]
    assert len(granted_steps) < len(dispatches), granted_steps
    backed_off = [e for e in dispatches if SILENT in json.loads(e.get("backed_off", "[]") or "[]")]
    assert backed_off
    measures = [e for e in attacked["log"] if e["kind"] == "measure" and e["actor"] == SILENT]
    assert all(int(e["tokens"]) == 0 for e in measures)  # nothing it claimed was ever measured as work


def test_cap_derives_from_the_lease():
    assert result_cap(GROUP, 8) < 4096 < result_cap(64, 1024) < HUGE
