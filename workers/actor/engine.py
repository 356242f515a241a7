"""The actor's inference-engine interface. Engines own the weights; the actor stages and activates deltas
through the engine's :class:`~aurora_store.codec.WeightTarget`, in place, at batch boundaries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aurora_store.codec import ModelLayout, WeightTarget


@dataclass(frozen=True)
class Completion:
    ids: tuple[int, ...]  # sampled tokens, including the end-of-sequence token when one was produced
    logprobs: tuple[float, ...]  # behaviour log-probability of each sampled token
    text: str

    def as_dict(self) -> dict:
        return {"ids": list(self.ids), "logprobs": [round(x, 6) for x in self.logprobs], "text": self.text}


class Engine(Protocol):
    name: str

    @property
    def target(self) -> WeightTarget:
        """The engine's weights (read-only here: engines narrow it to their own target class)."""
        ...

    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Completion]]:
        """``group_size`` samples per prompt, on the weights as they are now."""
        ...

    def weights_changed(self) -> None:
        """Called after a delta was activated in place (engines with caches of derived weights refresh them)."""
        ...

    def close(self) -> None: ...


def load_engine(kind: str, model_dir: Path, layout: ModelLayout, *, seed: int = 0) -> Engine:
    if kind == "torch":
        from workers.actor.engine_torch import TorchEngine

        return TorchEngine(model_dir, layout, seed=seed)
    if kind == "vllm":
        from workers.actor.engine_vllm import VllmEngine

        return VllmEngine(model_dir, layout, seed=seed)
    raise ValueError(f"unknown engine {kind!r}")
