"""The trainer's curves where RL users look for them: TensorBoard event files and, when configured,
Weights & Biases (``WANDB_MODE=offline`` works without a network). Both are optional dependencies."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aurora_store.config import CommandDefaults

log = logging.getLogger("aurora.trainer.curves")


class CurveLogger:
    def __init__(self, logdir: str | Path, *, run: str, config: dict[str, Any], use_wandb: bool = False) -> None:
        self.logdir = Path(logdir)
        self._tb = None
        self._wandb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(log_dir=str(self.logdir), flush_secs=5)
        except ImportError:
            log.warning("tensorboard is not installed: no event files (pip install tensorboard)")
        if use_wandb:
            try:
                import wandb

                self._wandb = wandb.init(project=CommandDefaults.from_env().wandb_project, name=run,
                                         dir=str(self.logdir), config=config, reinit=True)
            except ImportError:
                log.warning("--wandb given but wandb is not installed (pip install wandb)")

    @property
    def enabled(self) -> bool:
        return self._tb is not None or self._wandb is not None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
