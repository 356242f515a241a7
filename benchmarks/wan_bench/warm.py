"""Part 5's warm-started policy, built once and shared by every run as the trainer's ``--model``.

Each run's trainer would otherwise repeat the same seeded supervised warm start (``--warm-start-steps``) before
its first version — the biggest piece of a run's bootstrap on busy cores, paid once per run and per round. The
result is identical (same config, seed and steps as :meth:`workers.trainer.trainer.Trainer.start`), so it is
computed here once and saved as a model directory whose ``config.json`` is the very config dict the trainer
would have built (its layout, run info and snapshot side files are therefore unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.rl.model import DEFAULT_CONFIG, build_model, warm_start
from workers.rl.task import AdditionTask, build_tokenizer


def build(model_config: dict[str, Any], steps: int, out: Path, *, seed: int = 0, max_operand: int = 9) -> Path:
    """Build, warm-start and save the policy under ``out``; returns ``out``. ``max_operand`` must be the
    trainer's (its ``--max-operand`` default). A policy already saved there from the same inputs is reused
    (``--out`` kept between runs of the benchmark: a warm start costs minutes on busy cores)."""
    config = {**DEFAULT_CONFIG, **model_config}
    recipe = {"config": config, "steps": steps, "seed": seed, "max_operand": max_operand}
    marker = out / "warm.json"
    if marker.is_file() and json.loads(marker.read_text()) == recipe:
        return out
    tokenizer = build_tokenizer()
    model = build_model(config, seed=seed)
    if steps:
        warm_start(model, tokenizer, AdditionTask(max_operand=max_operand, seed=seed), steps, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    marker.write_text(json.dumps(recipe))  # last: a half-written directory is rebuilt
    return out
