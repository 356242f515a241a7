"""What an actor needs from an inference engine: the :class:`Engine` Protocol, the samples it returns, and the
placement options from the actor's command line. Engines own the weights; the actor stages and activates
deltas through the engine's :class:`~aurora_store.codec.WeightTarget`, in place, at batch boundaries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aurora_store.codec import ModelLayout, WeightTarget
from aurora_store.errors import ConfigError


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


@dataclass(frozen=True)
class EngineOptions:
    """Placement and vLLM engine settings from the actor's command line (``None`` = the engine's default)."""

    device: str = "auto"  # torch engine: "auto" (CUDA when available), "cuda" or "cpu"
    enforce_eager: bool | None = None  # vLLM: default True on the CPU backend only (CUDA graphs elsewhere)
    gpu_memory_utilization: float | None = None  # vLLM: fraction of GPU memory for weights + KV cache
    tensor_parallel_size: int = 1  # vLLM: TP ranks; every rank scatters its own slice of each delta


class EngineFactory(Protocol):
    """How the registry builds an engine (:func:`~workers.engines.registry.load_engine`)."""

    def __call__(self, model_dir: Path, layout: ModelLayout, *, seed: int, options: EngineOptions) -> Engine: ...


def torch_device(choice: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; explicit choices are checked."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device")
    if choice not in ("cuda", "cpu"):
        raise ConfigError(f"unknown device {choice!r}")
    return choice
