"""Training-name ⇄ inference-name layout.

Trainers hold HuggingFace tensors (``…q_proj.weight``, ``…k_proj.weight``, ``…v_proj.weight``); inference
engines such as vLLM hold them fused (``…qkv_proj.weight``) by stacking rows in a fixed order. A delta is
expressed in the *inference* layout so actors can scatter it straight into the engine's tensors: the
flat index of element ``(r, c)`` of component ``k`` is ``(row_offset_k + r) * row_size + c``.

The layout is derived from the model config alone, so trainer and actor agree on it without exchanging
tensors, and it is identified by a fingerprint (SHA-256 over its canonical JSON) that every manifest
carries.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import jsondoc
from aurora_store.codec.segment import MAX_NAME_BYTES
from aurora_store.errors import LayoutError, UnsupportedDtypeError

LAYOUT_FORMAT = "aurora.layout/1"

#: dtypes the codec accepts: compared and shipped as 16-bit patterns.
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    for name, candidate in DTYPES.items():
        if candidate == dtype:
            return name
    raise UnsupportedDtypeError(f"only 16-bit float tensors can be encoded, got {dtype}")


@dataclass(frozen=True)
class Component:
    """One training tensor that occupies rows ``[row_offset, row_offset + rows)`` of an inference tensor."""

    train_name: str
    row_offset: int
    rows: int


@dataclass(frozen=True)
class InferenceTensor:
    """A tensor as the inference engine holds it, made of one or more stacked training tensors."""

    name: str
    shape: tuple[int, ...]
    components: tuple[Component, ...]
    dtype: str = "bfloat16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row_size(self) -> int:
        """Elements per row (dim 0); 1 for vectors."""
        return math.prod(self.shape[1:])

    @property
    def is_fused(self) -> bool:
        return len(self.components) > 1

    def component_shape(self, component: Component) -> tuple[int, ...]:
        return (component.rows, *self.shape[1:])

    def component_span(self, component: Component) -> tuple[int, int]:
        """Flat index range ``[lo, hi)`` that ``component`` occupies in this tensor."""
        lo = component.row_offset * self.row_size
        return lo, lo + component.rows * self.row_size


@dataclass(frozen=True)
class ModelLayout:
    """The complete, ordered set of inference tensors of one model and where each training tensor goes.

    ``aliases`` lists training names that are the same tensor as another one (tied ``lm_head``): they are
    accepted in state dicts but never shipped twice.
    """

    tensors: tuple[InferenceTensor, ...]
    aliases: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            raise LayoutError("duplicate inference tensor names in layout")
        train = [c.train_name for t in self.tensors for c in t.components]
        if len(set(train)) != len(train):
            raise LayoutError("a training tensor is mapped more than once")
        for tensor in self.tensors:
            if tensor.dtype not in DTYPES:
                raise UnsupportedDtypeError(f"{tensor.name}: unsupported dtype {tensor.dtype}")
            if len(tensor.name.encode()) > MAX_NAME_BYTES:
                raise LayoutError(f"tensor name of {len(tensor.name.encode())} bytes is longer than the "
                                  f"{MAX_NAME_BYTES} a segment can carry: {tensor.name[:64]}…")
            # An empty tensor (a zero dimension) is carried like any other: it simply never changes.
            if not tensor.shape or any(d < 0 for d in tensor.shape):
                raise LayoutError(f"{tensor.name}: invalid shape {tensor.shape}")
            expected = 0
            for comp in tensor.components:
                if comp.row_offset != expected or comp.rows < 0:
                    raise LayoutError(f"{tensor.name}: components must tile dim 0 in order")
                expected += comp.rows
            if expected != tensor.shape[0]:
                raise LayoutError(f"{tensor.name}: components cover {expected} of {tensor.shape[0]} rows")

    # --- lookup ----------------------------------------------------------------------------------

    @cached_property
    def _by_name(self) -> dict[str, InferenceTensor]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def _by_train_name(self) -> dict[str, tuple[InferenceTensor, Component]]:
        return {c.train_name: (t, c) for t in self.tensors for c in t.components}

    def __getitem__(self, name: str) -> InferenceTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise LayoutError(f"tensor {name!r} is not part of this layout") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def locate(self, train_name: str) -> tuple[InferenceTensor, Component]:
        """The inference tensor and component a training tensor belongs to."""
        try:
            return self._by_train_name[train_name]
        except KeyError:
            raise LayoutError(f"training tensor {train_name!r} is not part of this layout") from None

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def train_names(self) -> list[str]:
        return [c.train_name for t in self.tensors for c in t.components]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return 2 * self.numel

    # --- identity --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LAYOUT_FORMAT,
            "tensors": [
                {
                    "name": t.name,
                    "shape": list(t.shape),
                    "dtype": t.dtype,
                    "components": [[c.train_name, c.rows] for c in t.components],
                }
                for t in self.tensors
            ],
            "aliases": [list(pair) for pair in self.aliases],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelLayout:
        try:
            if doc["format"] != LAYOUT_FORMAT:
                raise LayoutError(f"unknown layout format {doc['format']!r}")
            tensors = []
            for t in doc["tensors"]:
                offset = 0
                comps = []
                for train_name, rows in t["components"]:
                    rows = jsondoc.integer(rows, "component rows", LayoutError)
                    comps.append(Component(jsondoc.text(train_name, "component name", LayoutError), offset, rows))
                    offset += rows
                shape = tuple(jsondoc.integer(d, "shape dimension", LayoutError) for d in t["shape"])
                tensors.append(InferenceTensor(jsondoc.text(t["name"], "tensor name", LayoutError), shape,
                                               tuple(comps), jsondoc.text(t["dtype"], "dtype", LayoutError)))
            aliases = tuple((jsondoc.text(a, "alias", LayoutError), jsondoc.text(b, "alias", LayoutError))
                            for a, b in doc.get("aliases", ()))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"malformed layout document: {exc}") from exc
        return cls(tuple(tensors), aliases)

    @cached_property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(canonical).hexdigest()

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dtype: str = "bfloat16") -> ModelLayout:
        """Layout of a Qwen2 / Qwen3 / Llama (or Mistral) decoder from its HF ``config.json``."""
        return _decoder_layout(config, dtype)

    @classmethod
    def from_config_file(cls, path: str | Path, dtype: str = "bfloat16") -> ModelLayout:
        try:
            config = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise LayoutError(f"cannot read model config {path}: {exc}") from exc
        return cls.from_config(config, dtype)

    @classmethod
    def identity(cls, state: Mapping[str, torch.Tensor]) -> ModelLayout:
        """A layout that ships every tensor under its own name, unfused (for arbitrary checkpoints)."""
        tensors = []
        for name, tensor in state.items():
            shape = tuple(tensor.shape) if tensor.dim() else (1,)
            tensors.append(InferenceTensor(name, shape, (Component(name, 0, shape[0]),),
                                           dtype_name(tensor.dtype)))
        return cls(tuple(tensors))

    # --- state dicts -----------------------------------------------------------------------------

    def check_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Raise :class:`LayoutError` unless ``state`` holds exactly this layout's training tensors.

        Every parameter must be covered exactly once: a missing, unexpected, mis-shaped or mis-typed
        tensor is an error, never silently skipped.
        """
        unsupported = sorted(n for n, t in state.items() if t.dtype not in DTYPES.values())
        if unsupported:
            raise UnsupportedDtypeError(f"only 16-bit float tensors can be encoded; {len(unsupported)} are not: "
                                        f"{unsupported[:8]} ({state[unsupported[0]].dtype})")
        expected = set(self.train_names)
        alias_of = dict(self.aliases)
        present = set(state)
        missing = sorted(expected - present)
        unexpected = sorted(present - expected - set(alias_of))
        problems = []
        if missing:
            problems.append(f"missing {len(missing)}: {missing[:8]}")
        if unexpected:
            problems.append(f"unexpected {len(unexpected)}: {unexpected[:8]}")
        for name in sorted(expected & present):
            tensor, comp = self.locate(name)
            want = tensor.component_shape(comp)
            got = state[name]
            got_shape = tuple(got.shape) if got.dim() else (1,)
            if got_shape != want:
                problems.append(f"{name}: shape {got_shape} != {want}")
            elif got.dtype != DTYPES[tensor.dtype]:
                problems.append(f"{name}: dtype {got.dtype} != {tensor.dtype}")
        for alias, target in self.aliases:
            if alias in state and target in state and not _same_bits(state[alias], state[target]):
                problems.append(f"{alias} is declared tied to {target} but differs from it")
        if problems:
            raise LayoutError("state does not match layout: " + "; ".join(problems))

    def pieces(self, state: Mapping[str, torch.Tensor]) -> Iterator[tuple[InferenceTensor, int, torch.Tensor]]:
        """Yield ``(inference tensor, flat offset, flat 16-bit view)`` for every training tensor, in layout
        order, without materialising fused tensors."""
        self.check_state(state)
        for tensor in self.tensors:
            for comp in tensor.components:
                lo, _ = tensor.component_span(comp)
                yield tensor, lo, bits_view(state[comp.train_name])

    def fuse(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inference-layout tensors (new storage for fused ones) from training-layout ``state``."""
        self.check_state(state)
        fused: dict[str, torch.Tensor] = {}
        for tensor in self.tensors:
            parts = [state[c.train_name].reshape(tensor.component_shape(c)) for c in tensor.components]
            fused[tensor.name] = parts[0].clone() if len(parts) == 1 else torch.cat(parts, dim=0)
        return fused

    def split(self, fused: Mapping[str, torch.Tensor], *, include_aliases: bool = False) -> dict[str, torch.Tensor]:
        """Training-layout tensors (views) from inference-layout ``fused`` tensors."""
        missing = [t.name for t in self.tensors if t.name not in fused]
        unexpected = [n for n in fused if n not in self]
        if missing or unexpected:
            raise LayoutError(f"inference state does not match layout: missing {missing[:8]}, "
                              f"unexpected {unexpected[:8]}")
        out: dict[str, torch.Tensor] = {}
        for tensor in self.tensors:
            full = fused[tensor.name]
            if tuple(full.shape) != tensor.shape and full.numel() != tensor.numel:
                raise LayoutError(f"{tensor.name}: shape {tuple(full.shape)} != {tensor.shape}")
            full = full.reshape(tensor.shape)
            for comp in tensor.components:
                out[comp.train_name] = full[comp.row_offset: comp.row_offset + comp.rows]
        if include_aliases:
            for alias, target in self.aliases:
                out[alias] = out[target]
        return out


def bits_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat int16 view of their bit patterns (no copy when contiguous)."""
    dtype_name(tensor.dtype)
    return tensor.detach().contiguous().view(torch.int16).reshape(-1)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits_view(a), bits_view(b)))


_DECODER_TYPES = {"qwen2", "qwen3", "llama", "mistral"}


def _decoder_layout(config: Mapping[str, Any], dtype: str) -> ModelLayout:
    model_type = str(config.get("model_type", "")).lower()
    if model_type not in _DECODER_TYPES:
        raise LayoutError(f"unsupported model_type {model_type!r}; supported: {sorted(_DECODER_TYPES)}")
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        inter = int(config["intermediate_size"])
        layers = int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutError(f"model config lacks a required field: {exc}") from exc
    tied = bool(config.get("tie_word_embeddings", False))
    # Qwen2 always carries q/k/v biases; Llama/Qwen3 only with attention_bias.
    qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
    o_bias = model_type in {"llama", "mistral"} and bool(config.get("attention_bias", False))
    mlp_bias = model_type in {"llama", "mistral"} and bool(config.get("mlp_bias", False))
    qk_norm = model_type == "qwen3"

    def single(name: str, shape: tuple[int, ...]) -> InferenceTensor:
        return InferenceTensor(name, shape, (Component(name, 0, shape[0]),), dtype)

    def stacked(name: str, parts: list[tuple[str, int]], tail: tuple[int, ...]) -> InferenceTensor:
        comps, offset = [], 0
        for train_name, rows in parts:
            comps.append(Component(train_name, offset, rows))
            offset += rows
        return InferenceTensor(name, (offset, *tail), tuple(comps), dtype)

    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    tensors = [single("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        for kind in ("weight", "bias") if qkv_bias else ("weight",):
            tail = (hidden,) if kind == "weight" else ()
            tensors.append(stacked(f"{a}qkv_proj.{kind}", [(f"{a}q_proj.{kind}", q_rows),
                                                           (f"{a}k_proj.{kind}", kv_rows),
                                                           (f"{a}v_proj.{kind}", kv_rows)], tail))
        tensors.append(single(f"{a}o_proj.weight", (hidden, q_rows)))
        if o_bias:
            tensors.append(single(f"{a}o_proj.bias", (hidden,)))
        if qk_norm:
            tensors.append(single(f"{a}q_norm.weight", (head_dim,)))
            tensors.append(single(f"{a}k_norm.weight", (head_dim,)))
        for kind in ("weight", "bias") if mlp_bias else ("weight",):
            tail = (hidden,) if kind == "weight" else ()
            tensors.append(stacked(f"{m}gate_up_proj.{kind}", [(f"{m}gate_proj.{kind}", inter),
                                                               (f"{m}up_proj.{kind}", inter)], tail))
        tensors.append(single(f"{m}down_proj.weight", (hidden, inter)))
        if mlp_bias:
            tensors.append(single(f"{m}down_proj.bias", (hidden,)))
        tensors.append(single(p + "input_layernorm.weight", (hidden,)))
        tensors.append(single(p + "post_attention_layernorm.weight", (hidden,)))
    tensors.append(single("model.norm.weight", (hidden,)))
    aliases: tuple[tuple[str, str], ...] = ()
    if tied:
        aliases = (("lm_head.weight", "model.embed_tokens.weight"),)
    else:
        tensors.append(single("lm_head.weight", (vocab, hidden)))
    return ModelLayout(tuple(tensors), aliases)
