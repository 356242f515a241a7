"""`make demo-0.6b`'s configuration (the run itself takes tens of minutes on two shared cores, so no test runs
it): the trainer accepts its arguments, the model is exactly Qwen3-0.6B's shape, the bundled set loads."""

from __future__ import annotations

import json
from pathlib import Path

from aurora_store.codec.layout import ModelLayout
from benchmarks.scale import SIZES
from workers import demo
from workers.rl.model import DEFAULT_CONFIG
from workers.rl.task import MathFileTask
from workers.trainer.cli import parse_args


def test_real_demo_is_qwen3_06b_at_lr_1e_6_with_the_lean_optimizer(tmp_path: Path):
    spec = demo.real_spec(tmp_path, "qwen3-0.6b", steps=3, engine="torch")
    cfg = parse_args(["--bucket", str(tmp_path / "b"), "--redis", "redis://127.0.0.1:1/0",
                      "--checkpoint-dir", str(tmp_path / "ck"), *spec.trainer_args])
    assert cfg.lr == 1e-6 and cfg.optimizer == "adamw-bf16" and cfg.epochs == 1 and cfg.kl_coef > 0
    assert spec.actors == {demo.REMOTE: 1} and spec.home == demo.HOME  # one actor, behind one relay
    config = {**DEFAULT_CONFIG, **json.loads(cfg.model_config)}
    layout = ModelLayout.from_config(config)
    assert layout.fingerprint == ModelLayout.from_config(SIZES["qwen3-0.6b"]).fingerprint
    assert 590e6 < layout.numel < 600e6
    prompts = MathFileTask(cfg.dataset).prompts(0, 4)
    assert len(prompts) == 4 and all(p.meta["answer"].isdigit() for p in prompts)
