"""Sharded materialisation (meta device → fully_shard → load shard by shard) gives exactly the shards, buffers,
frozen reference and forward pass that broadcasting the whole model and sharding it gave, on 2 real ranks; and
activation checkpointing (on by default on CUDA) leaves FSDP2 training steps exactly as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_meta_shard_load_is_bit_identical_to_whole_model_sharding(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.trainer.fsdp.reshard_probe", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for kind in ("tied", "untied"):
        for r in (rank[kind] for rank in results):
            assert r["params"] and r["buffers"] and r["reference"] and r["forward"], (kind, r)
            assert r["meta_left"] == [] and r["reference_dtypes"] == ["torch.bfloat16"]
            assert r["tied"] == (kind == "tied")
        assert [r[kind]["rows"]["model.embed_tokens.weight"] for r in results] == [17, 16]  # 33 rows, uneven
    assert "lm_head.weight" not in results[0]["tied"]["rows"]
    assert all(r["recompute_same_steps"] for r in results)  # activation checkpointing under FSDP2
