"""The trainer's checkpoints on one rank: written from a staged copy (training may go on while the writer
thread works), one complete checkpoint left on disk, no published rows, a torn newest checkpoint ignored,
the disk budget checked with a typed error, and the default interval's rule."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from aurora_store.codec import ModelLayout
from aurora_store.errors import ConfigError, DiskBudgetError
from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.trainer import checkpoint
from workers.trainer.checkpoint import CheckpointInfo, Checkpoints, DiskPlan
from workers.trainer.cli import parse_args
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import ShardedPolicy
from workers.trainer.state import Started


def started(seed: int = 0, directory=None) -> Started:
    model = build_model(DEFAULT_CONFIG, seed=seed)
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    policy = ShardedPolicy.shard(model, layout, Ranks())
    learner = ShardedLearner(model, GRPOConfig(lr=1e-3), Ranks())
    return Started(policy, learner, Checkpoints(directory or "unused", Ranks()))


def trained(directory) -> Started:
    """A policy whose optimizer has state (one AdamW step on a made-up gradient)."""
    s = started(directory=directory)
    for param in s.policy.params.values():
        param.grad = torch.full_like(param, 1e-3)
    s.learner.optimizer.step()
    s.learner.optimizer.zero_grad()
    return s


def info(step: int) -> CheckpointInfo:
    return CheckpointInfo(step, step, [0.5] * step, 0)


def test_writes_what_was_staged_while_training_goes_on_and_keeps_one_checkpoint(tmp_path):
    s = trained(tmp_path)
    at_step_1 = {n: t.clone() for n, t in s.policy.master_rows().items()}
    s.save_checkpoint(info(1))  # in the background
    with torch.no_grad():  # the next step changes the weights in place while the writer may still run
        for local in s.policy.master_rows().values():
            local.add_(1.0)
    s.save_checkpoint(info(2))  # waits for step 1's checkpoint to be durable first
    s.checkpoints.wait()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]  # the previous one deleted once complete
    assert checkpoint.latest_step(tmp_path) == 2
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert not any("published" in f or ".tmp" in f for f in files)

    fresh = started(seed=1)  # other weights, no optimizer state
    loaded = fresh.load_checkpoint(tmp_path, Ranks())
    assert loaded == info(2)
    assert fresh.checkpoints.last_step == 2  # a resume with nothing left to train does not rewrite it in place
    for name, local in fresh.policy.master_rows().items():
        assert torch.equal(local, at_step_1[name] + 1.0), name
    saved, restored = s.learner.optimizer.state_dict(), fresh.learner.optimizer.state_dict()
    assert saved["state"].keys() == restored["state"].keys() and saved["state"]
    for index, state in saved["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(restored["state"][index][key]))
    assert [w["step"] for w in s.checkpoints.written] == [1, 2]


def test_a_torn_newest_checkpoint_leaves_the_previous_one_in_charge(tmp_path):
    s = trained(tmp_path)
    s.save_checkpoint(info(3), wait=True)
    keep = tmp_path / "keep"
    shutil.copytree(tmp_path / "step-00000003", keep)
    s.save_checkpoint(info(4), wait=True)
    shutil.move(keep, tmp_path / "step-00000003")
    # step 4 torn: its rank shard never got renamed into place
    shutil.move(tmp_path / "step-00000004" / "rank-00000-of-00001",
                tmp_path / "step-00000004" / ".rank-00000-of-00001.tmp")
    assert checkpoint.latest_step(tmp_path) == 3
    fresh = started(seed=1)
    assert checkpoint.load(tmp_path, fresh.policy, fresh.learner.optimizer, Ranks()).step == 3


def test_one_copy_mode_deletes_the_previous_checkpoint_before_writing(tmp_path):
    s = trained(tmp_path)
    s.save_checkpoint(info(1), wait=True)
    one = Checkpoints(tmp_path, Ranks(), keep_previous=False)
    one.save(s.policy, s.learner.optimizer, info(2))
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]
    assert json.loads((tmp_path / "step-00000002" / "info.json").read_text())["step"] == 2


def test_the_disk_budget_decides_two_copies_one_or_a_typed_error(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert checkpoint.plan_disk(tmp_path, free // 4).keep_previous
    assert not checkpoint.plan_disk(tmp_path, free * 2 // 3).keep_previous
    with pytest.raises(DiskBudgetError) as caught:
        checkpoint.plan_disk(tmp_path, free * 2)
    assert isinstance(caught.value, OSError)
    assert caught.value.needed == free * 2 + checkpoint.DISK_MARGIN_BYTES
    assert caught.value.needed > caught.value.free >= free * 0.9
    assert str(free * 2) in str(caught.value) and "free" in str(caught.value)


def test_the_default_interval_follows_checkpoint_size_and_disk():
    gib = 1 << 30
    assert checkpoint.default_every(DiskPlan(50 << 20, 100 * gib, True)) == 1  # a small model: every step
    qwen_06b = checkpoint.estimate_bytes(596_049_920, "adamw")  # 7.2 GB
    assert checkpoint.default_every(DiskPlan(qwen_06b, 100 * gib, True)) == 7
    assert checkpoint.default_every(DiskPlan(qwen_06b, 100 * gib, False)) == 14
    qwen_8b = checkpoint.estimate_bytes(8_190_735_360, "adamw-bf16")
    assert checkpoint.default_every(DiskPlan(qwen_8b, 1 << 40, True)) == 50


def test_the_trainer_refuses_a_non_positive_interval(capsys):
    base = ["--bucket", "b", "--redis", "redis://x", "--checkpoint-dir", "c"]
    assert parse_args(base).checkpoint_every is None
    assert parse_args([*base, "--checkpoint-every", "5"]).checkpoint_every == 5
    with pytest.raises(SystemExit):
        parse_args([*base, "--checkpoint-every", "0"])
    assert "--checkpoint-every must be at least 1" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        Checkpoints("c", Ranks(), every=0)
