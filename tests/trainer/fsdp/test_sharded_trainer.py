"""The sharded trainer's weight path on 2 real ranks (torchrun, gloo, FSDP2): what an actor reconstructs
from the ranks' deltas is bit-identical to what the ranks published, every manifest's digest is the
from-scratch hash, publishing moves no weights between ranks, sharded snapshots load into one process,
checkpoints resume exactly (and only with the same world size), and 2 ranks compute the 1-rank loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aurora_store.codec import ModelLayout, TensorTarget, digest_state
from aurora_store.follow import follow
from aurora_store.store import DeltaStore
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from tests.trainer.fsdp.worker import MODEL_CONFIG

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
STEPS = 4
#: torch.distributed collectives that move tensors; a publish may use them only for small JSON metadata.
WEIGHT_MOVERS = ("all_gather_single", "all_gather_into_tensor", "all_gather_coalesced", "reduce_scatter",
                 "reduce_scatter_single", "reduce_scatter_tensor", "all_reduce", "all_reduce_coalesced",
                 "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "scatter", "reduce",
                 "DTensor.full_tensor", "DTensor.redistribute", "FSDPModule.unshard")


def launch(tmp: Path, ranks: int, **extra) -> dict[int, dict]:
    spec = {"bucket": str(tmp / "bucket"), "checkpoint_dir": str(tmp / "ckpt"), "out": str(tmp / "out"),
            "steps": STEPS, "compute_dtype": "float32", **extra}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    proc = subprocess.run([sys.executable, *launcher, "-m", "tests.trainer.fsdp.worker", str(tmp / "spec.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return {r: json.loads((tmp / "out" / f"result-rank{r}.json").read_text()) for r in range(ranks)}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-ranks")
    return tmp, launch(tmp, 2, snapshot_at=2, resume_from=2)


@pytest.fixture(scope="module")
def one(tmp_path_factory, two):
    tmp = tmp_path_factory.mktemp("one-rank")
    return tmp, launch(tmp, 1, foreign_checkpoint=str(two[0] / "ckpt"))


def published(out: Path, version: int, layout: ModelLayout) -> dict[str, torch.Tensor]:
    """The whole bf16 policy of ``version`` as the ranks hold it: their dumped rows, stacked by start row."""
    where = out / "published" / f"v{version}"
    rows: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for path in sorted(where.glob("rank*.safetensors")):
        starts = json.loads(path.with_suffix(".json").read_text())
        for name, tensor in load_file(str(path)).items():
            rows.setdefault(name, []).append((starts[name], tensor))
    return {name: torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])]) for name, parts in rows.items()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_actor_reconstruction_equals_the_ranks_published_weights_at_every_version(two):
    tmp, results = two
    store = DeltaStore(str(tmp / "bucket"))
    layout = ModelLayout.from_config(MODEL_CONFIG)
    state, _ = load_snapshot(store, 0, layout)
    target = TensorTarget.from_state(layout, state, version=0)
    for version in range(STEPS + 1):
        if version:
            follow(store, target, version, snapshots=False)  # stage (verifies every digest) + activate, as actors do
        expected = published(tmp / "out", version, layout)
        assert set(expected) == set(layout.train_names)
        for name in layout.train_names:
            assert same_bits(state[name], expected[name]), (version, name)
        scratch = str(digest_state(layout, expected))
        assert str(target.full_digest()) == scratch
        if version:
            manifest = store.manifest(version)
            assert manifest.weights_digest == scratch == results[0]["versions"][str(version)]["scratch_digest"]


def test_manifests_list_each_ranks_segments_in_rank_order_over_disjoint_ranges(two):
    tmp, results = two
    store = DeltaStore(str(tmp / "bucket"))
    layout = ModelLayout.from_config(MODEL_CONFIG)
    embed = layout["model.embed_tokens.weight"]
    for version in range(1, STEPS + 1):
        manifest = store.manifest(version)
        ranks = results[0]["versions"][str(version)]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["segments"] > 1 for r in ranks)
        first = manifest.segments[: ranks[0]["segments"]]
        second = manifest.segments[ranks[0]["segments"]:]
        assert len(second) == ranks[1]["segments"]
        # vocab 33 over 2 ranks: rank 0 owns embedding rows [0, 17), rank 1 rows [17, 33)
        cut = 17 * embed.row_size
        assert all(c.hi <= cut for s in first for c in s.chunks if c.tensor == embed.name)
        assert all(c.lo >= cut for s in second for c in s.chunks if c.tensor == embed.name)
        # every rank announced exactly its own segments, each before the manifest existed (cut-through from
        # every rank, not from rank 0 after the gather)
        for rank, mine in ((0, first), (1, second)):
            announced = [(digest, late) for v, digest, late in results[rank]["announced"] if v == version]
            assert sorted(d for d, _ in announced) == sorted(s.digest for s in mine), (version, rank)
            assert not any(late for _, late in announced), (version, rank)


def test_publishing_moves_no_weights_between_ranks(two):
    _, results = two
    layout = ModelLayout.from_config(MODEL_CONFIG)
    for rank, result in results.items():
        # the audit does see weights move: FSDP all-gathers parameters during a training step
        assert result["train_audit"]["calls"].get("all_gather_single", 0) > 0
        assert sum(result["train_audit"]["bytes"].values()) > layout.nbytes / 2
        for audit in result["publish_audit"]:
            assert not {k for k in audit["calls"] if k in WEIGHT_MOVERS}, (rank, audit)
            assert audit["calls"].get("gather_object") == 1 and audit["calls"].get("broadcast_object_list") == 1
            assert sum(audit["bytes"].values()) < 32 << 10, (rank, audit)  # metadata only: a few KB
    assert all(b < layout.nbytes / 50 for b in results[0]["publish_metadata_bytes"])


def test_sharded_snapshot_loads_into_one_process_with_the_right_digest(two, tmp_path):
    from transformers import AutoModelForCausalLM

    tmp, _ = two
    store = DeltaStore(str(tmp / "bucket"))
    layout = ModelLayout.from_config(MODEL_CONFIG)
    manifest = read_snapshot_manifest(store, 2)
    assert manifest.weight_files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert manifest.weights_digest == store.manifest(2).weights_digest
    state, _ = load_snapshot(store, 2, layout, download_dir=tmp_path)  # digest recomputed from scratch
    target = TensorTarget.from_state(layout, state, version=2)
    assert str(target.full_digest()) == manifest.weights_digest
    expected = published(tmp / "out", 2, layout)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    for name in layout.train_names:
        assert same_bits(params[name].detach(), expected[name]), name
    assert str(digest_state(layout, {n: params[n].detach() for n in layout.train_names})) == manifest.weights_digest


def test_a_checkpoint_resumes_to_exactly_the_same_versions(two):
    _, results = two
    resumed = results[0]["resumed"]
    versions = results[0]["versions"]
    assert resumed["info_step"] == 2
    # master rows and optimizer state only: the published rows are rebuilt from the bucket on resume
    assert results[0]["checkpoint_files"] == ["info.json"] + [
        f"rank-0000{r}-of-00002{f}" for r in (0, 1) for f in ("", "/master.safetensors", "/optimizer.json",
                                                              "/optimizer.safetensors", "/rows.json")]
    for step in range(3, STEPS + 1):  # master weights + optimizer state restored bit for bit
        assert resumed["digests"][str(step)] == versions[str(step)]["manifest_digest"]


def test_resuming_with_another_world_size_is_a_clear_error(one):
    _, results = one
    assert "written by 2 rank(s)" in results[0]["foreign"] and "--nproc-per-node 2" in results[0]["foreign"]


def test_two_ranks_compute_the_single_process_loss_and_gradient(one, two):
    single, double = one[1][0]["stats"][0], two[1][0]["stats"][0]
    # step 1 starts from identical weights: same batch, same token-mean loss, same gradient (norm)
    assert single["tokens"] == double["tokens"]
    # float32 arithmetic over a differently split batch (each rank's matmuls see half the rows, so the CPU's
    # blocking and summation order differ; gloo adds the two halves): results agree to a few dozen float32 ulps
    # (u = 6e-8) of the magnitudes summed. The loss is a token mean of |advantage| · ratio terms (|advantage| ≤ ~2
    # after group normalisation, ratio ≈ 1), and it can cancel to near 0, so its bound is absolute at that
    # scale (1e-5 ≈ 170 u); the gradient norm is a sum of squares (no cancellation), so relative.
    assert double["loss"] == pytest.approx(single["loss"], rel=1e-5, abs=1e-5)
    assert double["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-5)


@pytest.fixture(scope="module")
def kl_runs(tmp_path_factory):
    return {ranks: launch(tmp_path_factory.mktemp(f"kl-{ranks}"), ranks, kl_coef=0.5)[0] for ranks in (1, 2)}


def test_the_kl_reference_is_bf16_frozen_and_sharded_like_the_policy(kl_runs):
    single, double = kl_runs[1]["reference"], kl_runs[2]["reference"]
    assert single["dtypes"] == double["dtypes"] == ["torch.bfloat16"]
    assert single["frozen"] and double["frozen"]
    assert not single["sharded"] and double["sharded"]
    # rank 0 holds about half of the reference (dim-0 chunks; vocab 33 splits 17 + 16)
    assert double["full_numel"] == single["full_numel"]
    assert 0.45 < double["local_numel"] / double["full_numel"] < 0.56


def test_two_ranks_compute_the_single_process_kl_loss(kl_runs):
    single, double = kl_runs[1]["stats"], kl_runs[2]["stats"]
    # reported from each step's last epoch (2 epochs per step): the policy has left the reference by then
    assert all(s["kl"] > 0 for s in single)
    for one, two in zip(single, double):
        assert two["tokens"] == one["tokens"]
        assert two["kl"] == pytest.approx(one["kl"], rel=1e-3, abs=1e-6)
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-3, abs=1e-5)
