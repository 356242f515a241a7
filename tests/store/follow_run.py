"""A short real run (trainer + one actor) over a bucket backend, checked version by version: shared by the
backend tests that prove a scheme carries a whole run (the registry's test-only scheme, Azure)."""

from __future__ import annotations

from pathlib import Path

from workers.cluster import ClusterSpec, LocalCluster

#: The trainer's own default. A GRPO step changes the weights only if some group's rewards differ; after 10
#: supervised steps the built-in model solved ~3 % of its sums (35 of 40 groups of 4 all failed), so both steps of
#: a 2-step run changed nothing about one run in eight (seen once). After 120, ~19 % (17 of 40 uniform): a step with
#: 8 uniform groups is a ~1-in-1,000 event, two in a row ~1 in a million. It costs ~4 CPU-s.
WARM_START_STEPS = 120


def run_and_check_every_version(run_dir: Path, bucket_url: str, *, run: str, steps: int, bucket_type: type,
                                env: dict[str, str] | None = None) -> None:
    """A trainer publishes ``steps`` versions to ``bucket_url`` and one actor follows: the actor ends on the
    trainer's digest, activated every version after its bootstrap in order, each on its manifest's digest, and
    every version changed the weights, and it leaves cleanly."""
    spec = ClusterSpec(run_dir=run_dir, steps=steps, batch_size=8, group_size=4, actors={"us-east": 1},
                       bucket_urls={"us-east": bucket_url}, run=run, snapshot_every=100,
                       trainer_args=["--warm-start-steps", str(WARM_START_STEPS), "--initial-lease-s", "60"],
                       actor_args=["--verify-full-digest"], env=env or {})
    with LocalCluster(spec) as cluster:  # the children inherit the parent's environment (credentials)
        summary = cluster.wait_trainer_done(timeout=240)
        final = summary["trainer_version"]
        state = cluster.wait_actors_on(final, 60)[cluster.actor_ids[0]]

        def log_has_final() -> list[dict[str, str]] | None:
            # The actor's state can show a version before its run-log event is written (a heartbeat between
            # the two, its digest check taking long on a loaded machine): wait for the event too.
            entries = cluster.plane.run_log()
            return entries if any(e["kind"] in ("activate", "actor_bootstrap") and int(e["version"]) == final
                                  for e in entries) else None

        log = cluster.wait_for(log_has_final, 30, f"the run log's event for v{final}")
        store = cluster.store()
        assert isinstance(store.bucket, bucket_type), type(store.bucket)
        assert final == steps, summary
        assert state.active_digest == summary["trainer_digest"], (state, summary)
        (boot,) = [int(e["version"]) for e in log if e["kind"] == "actor_bootstrap"]
        activated = {int(e["version"]): e["digest"] for e in log if e["kind"] == "activate"}
        assert sorted(activated) == list(range(boot + 1, final + 1)), (boot, activated)
        assert activated == {v: store.manifest(v).weights_digest for v in activated}
        assert len(set(activated.values())) == len(activated), activated  # every version changed the weights
        cluster.group.stop_all()
        assert cluster.group[f"actor-{cluster.actor_ids[0]}"].process.returncode == 0  # it left gracefully
