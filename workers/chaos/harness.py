"""What every chaos scenario shares: fast cluster settings, run-log helpers, and the invariants checked
after each scenario.

Invariants (checked from the outside, on the run log, the buckets and the live states):
* no accepted rollout whose version, digest or lease expiry doesn't match its job;
* no prompt of a step lost or counted twice (every step accepted exactly its batch);
* every live actor's weights equal the trainer's at its active version (digest of that version; actors
  also re-hash all weights after every activation with ``--verify-full-digest`` and die on a mismatch);
* the versions are contiguous and every bucket passes a full integrity check.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.errors import AuroraError
from aurora_store.store import DeltaStore
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from workers.cluster import ClusterSpec, LocalCluster

#: Settings that make failures visible quickly: short heartbeat TTL and lease bounds, small batches.
FAST_ENV = {"AURORA_HEARTBEAT_TTL": "3", "AURORA_READ_TIMEOUT": "5", "AURORA_CONNECT_TIMEOUT": "3"}


@dataclass
class ScenarioResult:
    name: str
    faults: list[str]
    steps: int = 0
    accepted: int = 0
    rejected: int = 0
    lost: int = 0
    longest_stall_s: float = 0.0
    invariants: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def all_held(self) -> bool:
        return bool(self.invariants) and all(self.invariants.values())

    def as_dict(self) -> dict[str, Any]:
        return {"faults": self.faults, "steps": self.steps, "accepted": self.accepted, "rejected": self.rejected,
                "lost": self.lost, "longest_stall_s": round(self.longest_stall_s, 3),
                "invariants": self.invariants, "invariants_held": self.all_held, "figures": self.figures,
                "notes": self.notes}


def fast_spec(run_dir: Path, *, steps: int = 8, batch_size: int = 16, group_size: int = 4,
              actors: dict[str, int] | None = None, env: dict[str, str] | None = None,
              trainer_args: list[str] | None = None, actor_args: list[str] | None = None, **kw) -> ClusterSpec:
    return ClusterSpec(
        run_dir=run_dir, steps=steps, batch_size=batch_size, group_size=group_size,
        actors=actors or {"us-east": 3}, snapshot_every=kw.pop("snapshot_every", 5),
        env={**FAST_ENV, **(env or {})},
        trainer_args=["--initial-lease-s", "8", "--warm-start-steps", "0", *(trainer_args or [])],
        actor_args=["--verify-full-digest", *(actor_args or [])], **kw)


def ms(entry: dict[str, str]) -> int:
    return int(entry["id"].split("-")[0])


def events(log: list[dict[str, str]], kind: str) -> list[dict[str, str]]:
    return [e for e in log if e.get("kind") == kind]


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_version(cluster: LocalCluster, version: int, timeout: float = 300) -> None:
    cluster.wait_for(lambda: cluster.trainer_version() >= version, timeout, f"trainer version {version}")


def wait_actor_ready(cluster: LocalCluster, actor_id: str, timeout: float = 180) -> None:
    """Until ``actor_id`` has bootstrapped and registered: a process still starting up (it may bootstrap
    from a newer snapshot than the fault targets) cannot yet be the subject of a fault."""
    cluster.wait_for(lambda: actor_id in cluster.plane.actors(), timeout, f"actor {actor_id} registered")


def longest_stall(log: list[dict[str, str]], actors: list[str], start_ms: int, end_ms: int) -> float:
    """Longest gap (s) between consecutive results of any of ``actors`` inside ``[start_ms, end_ms]``."""
    times: dict[str, list[int]] = defaultdict(list)
    for entry in events(log, "settle"):
        t = ms(entry)
        if entry.get("actor") in actors and start_ms <= t <= end_ms:
            times[entry["actor"]].append(t)
    gaps = [(b - a) / 1000 for series in times.values() for a, b in itertools.pairwise(series)]
    return max(gaps, default=0.0)


def version_digest(store: DeltaStore, version: int) -> str:
    if version in store.versions():
        return store.manifest(version).weights_digest
    return read_snapshot_manifest(store, version).weights_digest


def check_invariants(cluster: LocalCluster, summary: dict[str, Any], log: list[dict[str, str]], *,
                     expected_steps: int, expected_dead: Set[str] = frozenset(),
                     collected_through: int = 0) -> tuple[dict[str, bool], list[str]]:
    """``collected_through``: a gc removed the deltas up to this version (the listing starts after it)."""
    problems: list[str] = []
    inv: dict[str, bool] = {}
    batch = cluster.spec.batch_size
    store = cluster.store()

    accepted = [e for e in events(log, "settle") if e.get("accepted") == "1"]
    bad = [e for e in accepted if e.get("version") != e.get("job_version") or e.get("digest") != e.get("job_digest")
           or int(e.get("arrival_ms") or 0) > int(e.get("expires_ms") or 0)]
    inv["accepted_rollouts_match_their_jobs"] = not bad
    if bad:
        problems.append(f"accepted mismatched rollouts: {bad[:3]}")

    # A restarted trainer redoes the step it died in: count each step's acceptances by the incarnation that
    # finished it (the last one to settle anything for that step).
    last_trainer: dict[int, str] = {}
    for e in events(log, "settle"):
        last_trainer[int(e["step"])] = e.get("trainer", "")
    per_step: dict[int, list[str]] = defaultdict(list)
    for e in accepted:
        if e.get("trainer", "") == last_trainer[int(e["step"])]:
            per_step[int(e["step"])].append(e.get("prompt", ""))
    steps_done = summary.get("steps", 0)
    lost_or_double = [s for s in range(1, steps_done + 1)
                      if s in per_step and (len(per_step[s]) != batch or len(set(per_step[s])) != batch)]
    inv["no_prompt_lost_or_counted_twice"] = (not lost_or_double and summary.get("rollouts_accepted") ==
                                             steps_done * batch)
    if not inv["no_prompt_lost_or_counted_twice"]:
        problems.append(f"steps with lost/double prompts: {lost_or_double[:5]}; accepted "
                        f"{summary.get('rollouts_accepted')} for {steps_done} steps")

    inv["all_steps_completed"] = steps_done == expected_steps
    versions = store.versions()
    inv["versions_contiguous"] = versions == list(range(collected_through + 1, expected_steps + 1))

    mismatched = []
    for actor_id, (state, _) in cluster.plane.actors().items():
        if state.active_version is None:
            continue
        if state.active_digest != version_digest(store, state.active_version):
            mismatched.append(actor_id)
    died = [n for n, p in cluster.group.processes.items()
            if n.startswith("actor-") and not p.alive and p.process.returncode not in (0, -9, -15)
            and n.removeprefix("actor-") not in expected_dead]
    inv["live_actors_bit_identical"] = not mismatched and not died
    if mismatched or died:
        problems.append(f"digest mismatch: {mismatched}; actors died: {died}")

    inv["buckets_verify"] = True
    for region, url in cluster.buckets.items():
        report = verify_bucket(url)
        if not report["ok"]:
            inv["buckets_verify"] = False
            problems.append(f"verify {region}: {report['problems'][:3]}")
    return inv, problems


def verify_bucket(url: str) -> dict[str, Any]:
    """Full integrity check of a bucket (every manifest's segments present and matching, chain unbroken)."""
    try:
        from aurora_store.ops.verify import verify_bucket as verify

        report = verify(url, deep=True)
        return {"ok": report.ok, "problems": [str(p) for p in report.problems]}
    except ImportError:
        return _basic_verify(url)


def _basic_verify(url: str) -> dict[str, Any]:
    problems = []
    store = DeltaStore(url)
    try:
        previous = None
        for version in store.versions():
            manifest = store.manifest(version)
            for ref in manifest.segments:
                store.get_segment(ref)
            if previous is not None and manifest.base_weights_digest != previous:
                problems.append(f"version {version}: base digest does not chain")
            previous = manifest.weights_digest
    except AuroraError as exc:
        problems.append(str(exc))
    return {"ok": not problems, "problems": problems}


def finish(result: ScenarioResult, cluster: LocalCluster, summary: dict[str, Any], log: list[dict[str, str]], *,
           expected_steps: int, expected_dead: Set[str] = frozenset(), collected_through: int = 0) -> ScenarioResult:
    invariants, problems = check_invariants(cluster, summary, log, expected_steps=expected_steps,
                                            expected_dead=expected_dead, collected_through=collected_through)
    result.invariants.update(invariants)
    result.notes.extend(problems)
    if not result.all_held:  # a failure must be explainable from the report alone (CI keeps nothing else)
        result.notes.append(cluster.diagnostics())
    result.steps = summary.get("steps", 0)
    result.accepted = summary.get("rollouts_accepted", 0)
    result.rejected = summary.get("rollouts_rejected", 0)
    result.lost = max(0, expected_steps * cluster.spec.batch_size - result.accepted) if result.steps < expected_steps \
        else 0
    return result


def dump(result: ScenarioResult, run_dir: Path) -> None:
    (run_dir / "scenario.json").write_text(json.dumps({result.name: result.as_dict()}, indent=2, default=str))
