"""The trainer's memory plan: Qwen3-8B on one 139 GiB GPU fits with the new defaults and not with the old
settings; the plan matches the peak measured for a small model on the CPU within 15 %; the trainer refuses
to start, with a typed error, when its plan does not fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from aurora_store.errors import ConfigError, InsufficientMemoryError
from workers.trainer import memory

QWEN3_8B = Path(__file__).parent / "data" / "qwen3-8b-config.json"
SMALL = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 8192, "tie_word_embeddings": False,
         "max_position_embeddings": 256}


def _plan_cli(*extra: str, capsys) -> tuple[int, dict]:
    """``python -m workers.trainer --plan-memory … --json`` in this process (its entry point, minus the start-up)."""
    rc = memory.run_cli(["--plan-memory", "--model-config", str(QWEN3_8B), "--gpu-memory-gib", "139",
                         "--plan-sequences", "16", "--plan-seq-len", "2048", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_qwen3_8b_fits_one_h200_with_the_new_defaults_and_not_with_the_old(capsys):
    shape = memory.ModelShape.from_file(QWEN3_8B)
    assert 8.1e9 < shape.params < 8.3e9  # Qwen3-8B: 8.19 B parameters, untied head
    rc, new = _plan_cli(capsys=capsys)
    assert rc == 0 and new["fits"] is True
    assert new["per_gpu_bytes"] <= 139 * memory.GIB == new["budget_bytes"]
    assert new["settings"]["optimizer"] == "adamw-bf16" and new["settings"]["logits_chunk"] > 0
    cats = new["categories"]
    assert cats["master"] == 4 * shape.params and cats["optimizer"] == 4 * shape.params  # fp32 master, bf16 moments
    assert cats["published"] == 2 * shape.params  # one bf16 copy
    rc, old = _plan_cli("--plan-settings", "old", capsys=capsys)
    assert rc == 3 and old["fits"] is False
    assert old["per_gpu_bytes"] > 139 * memory.GIB
    assert "does not fit" in old["why"] and any("fp32 moments" in n for n in old["notes"])
    # Each old setting alone already costs what the new one saves: moments, logits, the publish's second copy.
    assert old["phases"]["optimizer"]["optimizer"] == 8 * shape.params
    assert old["phases"]["publish"]["published"] == 2 * new["categories"]["published"]
    assert old["phases"]["backward_head"]["logits"] > 50 * memory.GIB > new["phases"]["backward_head"]["logits"]


def test_the_command_prints_fits_and_every_category():
    """The real entry point, once: ``python -m workers.trainer --plan-memory`` (text), and ``--help`` shows it."""
    out = subprocess.run([sys.executable, "-m", "workers.trainer", "--plan-memory", "--model-config", str(QWEN3_8B),
                          "--gpu-memory-gib", "139", "--world-size", "8"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fits: True" in out.stdout and "per_gpu_bytes:" in out.stdout
    for category in ("master", "optimizer", "published", "activations", "logits", "gradients"):
        assert category in out.stdout
    from workers.trainer.cli import build_parser

    help_text = build_parser().format_help()
    assert "--plan-memory" in help_text and "--gpu-memory-gib" in help_text and "--world-size" in help_text


def test_sharding_divides_the_states_and_bad_input_is_refused():
    shape = memory.ModelShape.from_file(QWEN3_8B)
    batch = memory.Batch(2, 2048)
    one = memory.plan(shape, batch, replace(memory.NEW, optimizer="adamw"), world_size=1)
    eight = memory.plan(shape, batch, replace(memory.NEW, optimizer="adamw"), world_size=8)
    assert eight.phases["optimizer"]["optimizer"] * 8 >= one.phases["optimizer"]["optimizer"]
    assert eight.phases["optimizer"]["optimizer"] * 8 - one.phases["optimizer"]["optimizer"] < 64
    with pytest.raises(ConfigError, match="one rank only"):
        memory.plan(shape, batch, memory.NEW, world_size=2)
    with pytest.raises(ConfigError, match="lacks 'hidden_size'"):
        memory.ModelShape.from_config({"num_hidden_layers": 2})
    with pytest.raises(ConfigError):
        memory.Batch(0, 10)


@pytest.fixture(scope="module")
def measured_peaks() -> dict[str, int]:
    """Resident-memory peaks of a real GRPO step (two epochs, a published bf16 copy alive) for each setting,
    measured in one child process (method: tests/trainer/memory_probe.py)."""
    args = {"config": SMALL, "settings": ["new", "bf16", "old"], "sequences": 8, "prompt": 32, "completion": 96}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "tests.trainer.memory_probe", json.dumps(args)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


@pytest.mark.parametrize("which", ["new", "bf16", "old"])
def test_plan_matches_measured_peak_on_cpu(which, measured_peaks):
    """The plan's peak for one CPU rank vs the peak the real step reached."""
    measured = measured_peaks[which]
    from workers.rl.model import DEFAULT_CONFIG

    shape = memory.ModelShape.from_config({**DEFAULT_CONFIG, **SMALL})
    # "new": the CPU rank's fp32 compute; "bf16": the CUDA defaults (bf16 autocast) on the CPU's autocast;
    # "old": AdamW (per tensor on the CPU) with full logits and no recompute.
    settings = {"new": replace(memory.NEW, compute="float32", logits_chunk=256),
                "bf16": replace(memory.NEW, logits_chunk=256),
                "old": replace(memory.OLD, foreach=False, grads_freed=True)}[which]
    planned = memory.plan(shape, memory.Batch(8, 128, 96), settings, device="cpu").per_gpu_bytes
    assert abs(measured - planned) <= 0.15 * measured, (which, measured, planned)


def test_trainer_refuses_to_start_when_the_plan_does_not_fit(tmp_path):
    """--gpu-memory-gib makes the start check run on the CPU too: a budget below the plan stops the trainer
    before it opens the bucket or Redis (nothing listens on the Redis port given)."""
    bucket = tmp_path / "bucket"
    out = subprocess.run([sys.executable, "-m", "workers.trainer", "--bucket", str(bucket), "--redis",
                          "redis://127.0.0.1:9/0", "--checkpoint-dir", str(tmp_path / "ckpt"), "--device", "cpu",
                          "--model-config", str(QWEN3_8B), "--gpu-memory-gib", "139"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert InsufficientMemoryError.__name__ in out.stderr and "will not fit" in out.stderr
    assert not bucket.exists() and not (tmp_path / "ckpt").exists()


def test_cuda_defaults_and_cpu_behaviour():
    """auto: lean optimizer, recompute and bf16 autocast on one CUDA rank; the CPU keeps exact fp32 AdamW."""
    import torch

    from workers.trainer.cli import parse_args, resolve_activation_checkpointing, resolve_optimizer
    from workers.trainer.device import autocast_dtype

    cfg = parse_args(["--bucket", "b", "--redis", "redis://127.0.0.1:1/0", "--checkpoint-dir", "c"])
    assert (cfg.optimizer, cfg.activation_checkpointing, cfg.logits_chunk) == ("auto", "auto", 2048)
    assert resolve_optimizer("auto", "cuda", 1) == "adamw-bf16"
    assert resolve_optimizer("auto", "cuda", 8) == resolve_optimizer("auto", "cpu", 1) == "adamw"
    assert resolve_optimizer("adamw", "cuda", 1) == "adamw"
    assert resolve_activation_checkpointing("auto", "cuda") and not resolve_activation_checkpointing("auto", "cpu")
    assert autocast_dtype(torch.device("cuda", 0), "bfloat16", 1) is torch.bfloat16
    assert autocast_dtype(torch.device("cpu"), "bfloat16", 1) is None
    assert autocast_dtype(torch.device("cuda", 0), "bfloat16", 2) is None  # FSDP2 gathers in bf16 itself
    with pytest.raises(SystemExit):
        parse_args(["--bucket", "b", "--redis", "r"])  # --checkpoint-dir is still required to train
