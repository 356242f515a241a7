"""DeepSeek-V3 snapshots as an engine loads them, and the torch actor following a DeepSeek-V3 run (no vLLM).

A trainer holds DeepSeek's routed experts as 3-D tensors and its router's score-correction bias as a float32
buffer; vLLM's DeepSeek loader reads experts only per expert and needs the bias. So a snapshot's files hold the
family's snapshot names (per expert, as ``save_pretrained`` writes them) and the bias as the trainer holds it,
while the run's layout, deltas and digest stay on the trainer's names. Here: the files, the one-rank sharded
writer against the plain one, the readers (back to the trainer's names, bit for bit), and the torch engine
booted from the snapshot and following an AdamW step bit-exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from aurora_store.codec import ModelLayout, TensorTarget, digest_state
from aurora_store.codec.namesets import convert, snapshot_layout
from aurora_store.errors import LayoutError, LayoutMismatchError
from aurora_store.follow import BucketChain, Follower
from aurora_store.follow.stage import stage_snapshot
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot, write_snapshot
from aurora_store.testing.builders import publish
from tests.vllm.tiny_families import config_of
from workers.publish.ranks import Ranks
from workers.publish.snapshot import held_constants, plan_files, write_sharded_snapshot
from workers.rl.model import build_model, side_files
from workers.rl.task import build_tokenizer

CONFIG = config_of("deepseek_v3")
LAYOUT = ModelLayout.from_config(CONFIG)
FILES = snapshot_layout(CONFIG)
BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"
EXPERTS = "model.layers.1.mlp.experts."


def _cast(model) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {n: params[n].detach().to(torch.bfloat16).contiguous() for n in LAYOUT.train_names}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Version 0 (a snapshot by the trainer's sharded writer, one rank) and version 1 (one AdamW step, as a delta
    and as a snapshot by the plain writer) of a tiny DeepSeek-V3 trained in fp32, with a non-zero router bias."""
    root = tmp_path_factory.mktemp("deepseek")
    model = build_model(CONFIG, seed=0)
    with torch.no_grad():  # a bias as training would have adjusted it: every expert's value differs
        model.get_buffer(BIAS).copy_(torch.linspace(-0.5, 0.5, CONFIG["n_routed_experts"]))
    store = DeltaStore(open_bucket(str(root / "bucket"), create=True))
    side = side_files(CONFIG, build_tokenizer())
    states = [_cast(model)]
    digests = [digest_state(LAYOUT, states[0])]
    write_sharded_snapshot(Ranks(), store, 0, LAYOUT, _rows(states[0]), digests[0], extra_files=side,
                           files_layout=FILES, constants=held_constants(model, LAYOUT))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, CONFIG["vocab_size"], (8, 16), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    states.append(_cast(model))
    publish(store, LAYOUT, states[0], states[1], 1, digests[0])
    digests.append(digest_state(LAYOUT, states[1]))
    write_snapshot(store, 1, states[1], LAYOUT, digests[1], extra_files=side, files_layout=FILES,
                   constants=held_constants(model, LAYOUT))
    return {"root": root, "store": store, "states": states, "digests": digests, "model": model, "side": side}


def _rows(state):
    from aurora_store.codec.sharding import LocalRows

    return {n: LocalRows(n, 0, t) for n, t in state.items()}


def test_snapshot_files_hold_per_expert_tensors_and_the_float32_router_bias(run):
    manifest = read_snapshot_manifest(run["store"], 0)
    assert manifest.layout_fingerprint == LAYOUT.fingerprint  # the run's layout: deltas and digest unchanged
    assert manifest.files_layout == FILES.fingerprint != LAYOUT.fingerprint
    assert run["store"].layout(FILES.fingerprint) == FILES  # stored before the manifest named it
    (name,) = manifest.weight_files
    files = load_file(str(_download(run, 0, name)))
    assert set(files) == set(FILES.train_names) | {BIAS}
    assert not any(n.startswith(EXPERTS) and n.endswith(("gate_up_proj", "down_proj")) for n in files)
    assert files[BIAS].dtype == torch.float32 and torch.equal(files[BIAS], run["model"].get_buffer(BIAS))
    per_expert = convert(run["states"][0], LAYOUT, FILES)
    for e in range(CONFIG["n_routed_experts"]):
        gate = files[f"{EXPERTS}{e}.gate_proj.weight"]
        assert torch.equal(gate, run["states"][0][EXPERTS + "gate_up_proj"][e, : gate.shape[0]])
        assert torch.equal(files[f"{EXPERTS}{e}.down_proj.weight"], run["states"][0][EXPERTS + "down_proj"][e])
    assert all(torch.equal(files[n].view(torch.int16), t.view(torch.int16)) for n, t in per_expert.items())


def _download(run, version, name):
    path = run["root"] / f"raw-{version}-{name}"
    path.write_bytes(run["store"].get_object(object_names.snapshot_dir(version) + name))
    return path


def test_one_rank_sharded_snapshot_is_byte_identical_to_the_plain_writer(run, tmp_path):
    other = DeltaStore(open_bucket(str(tmp_path / "plain"), create=True))
    write_snapshot(other, 0, run["states"][0], LAYOUT, run["digests"][0], extra_files=run["side"],
                   files_layout=FILES, constants=held_constants(run["model"], LAYOUT))
    sharded, plain = read_snapshot_manifest(run["store"], 0), read_snapshot_manifest(other, 0)
    assert sharded.files == plain.files and sharded.to_bytes() == plain.to_bytes()
    # Two ranks: each re-cut expert tensor is written whole by one owner; rank 0 writes the constants.
    plan = plan_files(LAYOUT, 2, 1 << 16, files_layout=FILES, constants={BIAS: 16})
    owner = {n: f.owner for f in plan for n in f.tensors}
    assert set(owner) == set(FILES.train_names) | {BIAS} and owner[BIAS] == 0
    w13 = FILES["model.layers.1.mlp.experts.routed_experts.w13_weight"]
    assert len({owner[c.train_name] for c in w13.components}) == 1
    assert {f.owner for f in plan} == {0, 1}


def test_readers_give_the_trainers_names_back_bit_for_bit(run):
    state, manifest = load_snapshot(run["store"], 1, LAYOUT)
    assert set(state) == set(LAYOUT.train_names) and manifest.files_layout == FILES.fingerprint
    assert all(torch.equal(state[n].view(torch.int16), t.view(torch.int16)) for n, t in run["states"][1].items())
    # A target on version 0 stages snapshot 1 (other names in the files, the same engine tensors) to its digest.
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in run["states"][0].items()}, version=0)
    staged = stage_snapshot(run["store"], 1, target)
    assert staged.weights_digest == str(run["digests"][1])
    follower = Follower(BucketChain(run["store"]))
    follower.attach(target)
    assert follower.activate(staged) and target.full_digest() == run["digests"][1]


def test_a_snapshot_whose_files_layout_is_another_models_is_refused(run, tmp_path):
    store = DeltaStore(open_bucket(str(tmp_path / "bad"), create=True))
    other = ModelLayout.from_config({**CONFIG, "n_routed_experts": 8}, names="checkpoint")
    with pytest.raises(LayoutMismatchError):
        write_snapshot(store, 0, run["states"][0], LAYOUT, run["digests"][0], files_layout=other)
    with pytest.raises(LayoutError, match="not engine-only constants"):
        write_snapshot(store, 0, run["states"][0], LAYOUT, run["digests"][0],
                       constants={"model.layers.0.mlp.gate.e_score_correction_bias": torch.zeros(4)})


def test_the_torch_engine_boots_from_the_snapshot_and_follows_a_step_bit_exactly(run, tmp_path):
    from workers.engines.torch_engine import TorchEngine

    follower = Follower(BucketChain(run["store"]))
    boot = follower.bootstrap(run["store"], 0, tmp_path / "cache")
    engine = TorchEngine(boot.model_dir, boot.layout, version=0)
    follower.attach(engine.target, boot)  # the engine's weights hash to the snapshot's digest, from scratch
    assert torch.equal(engine.model.get_buffer(BIAS), run["model"].get_buffer(BIAS))  # loaded, not re-initialised
    report = follower.follow_to(1)
    assert report.steps and engine.target.version == 1
    assert engine.target.full_digest() == engine.target.digest == run["digests"][1]
    params = dict(engine.model.named_parameters())
    for name, want in run["states"][1].items():
        assert torch.equal(params[name].view(torch.int16), want.view(torch.int16)), name
    changed = run["store"].manifest(1).changed
    assert changed.get(EXPERTS + "routed_experts.w13_weight") and changed.get(
        "model.layers.1.self_attn.kv_b_proj.weight"), "the step reached the experts and the latent attention"
