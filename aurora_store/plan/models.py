"""Model sizes for planning: parameter counts from layer shapes (Qwen3 sizes built in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aurora_store.errors import PlanError


@dataclass(frozen=True)
class Shapes:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = True

    @property
    def parameters(self) -> int:
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + 2 * self.head_dim  # q, k, v, o projections; q/k norms
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        layer = attention + mlp + 2 * h  # two RMSNorms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h

    @property
    def bf16_bytes(self) -> int:
        return 2 * self.parameters


#: Qwen3 dense models (their published configs).
QWEN3: dict[str, Shapes] = {
    "qwen3-0.6b": Shapes(1024, 3072, 28, 16, 8, 128, 151936, True),
    "qwen3-1.7b": Shapes(2048, 6144, 28, 16, 8, 128, 151936, True),
    "qwen3-4b": Shapes(2560, 9728, 36, 32, 8, 128, 151936, True),
    "qwen3-8b": Shapes(4096, 12288, 36, 32, 8, 128, 151936, False),
    "qwen3-14b": Shapes(5120, 17408, 40, 40, 8, 128, 151936, False),
    "qwen3-32b": Shapes(5120, 25600, 64, 64, 8, 128, 151936, False),
}


def resolve(model: str | Mapping[str, Any]) -> Shapes:
    """A Qwen3 size name (``"qwen3-8b"``, ``"8B"``) or a mapping of layer shapes (HF config keys)."""
    if isinstance(model, str):
        key = model.lower()
        key = key if key.startswith("qwen3-") else f"qwen3-{key}"
        if key not in QWEN3:
            raise PlanError(f"unknown model {model!r}; known: {', '.join(QWEN3)} (or give layer shapes)")
        return QWEN3[key]
    fields = {f: model[f] for f in Shapes.__dataclass_fields__ if f in model}
    fields.setdefault("head_dim", int(model.get("hidden_size", 0)) // max(int(model.get("num_attention_heads", 1)), 1))
    fields.setdefault("num_key_value_heads", model.get("num_attention_heads"))
    try:
        typed: dict[str, Any] = {k: (bool(v) if k == "tie_word_embeddings" else int(v)) for k, v in fields.items()}
        shapes = Shapes(**typed)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"model shapes: {exc}") from None
    if min(shapes.hidden_size, shapes.intermediate_size, shapes.num_hidden_layers, shapes.vocab_size) <= 0:
        raise PlanError("model shapes must be positive")
    return shapes
