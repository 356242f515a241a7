"""Training-name ⇄ inference-name layout.

Trainers hold HuggingFace tensors (``…q_proj.weight``, ``…k_proj.weight``, ``…v_proj.weight``); inference
engines such as vLLM hold them fused (``…qkv_proj.weight``) by stacking rows in a fixed order. A delta is
expressed in the *inference* layout so actors can scatter it straight into the engine's tensors: the
flat index of element ``(r, c)`` of component ``k`` is ``(row_offset_k + r) * row_size + c``. Routed experts
stack the same way into 3-D tensors: with ``stack_dims = 2`` the first two dims of ``[E, R, C]`` form the row
axis, so expert ``e``'s per-expert 2-D tensors occupy rows ``e·R + …`` (see :mod:`aurora_store.codec.families`,
which holds the per-architecture facts). A component whose elements the engine holds in another order than the
trainer stores them (gpt-oss's transposed experts) carries an :class:`~aurora_store.codec.order.ElementOrder`:
its block of the inference tensor is the training tensor in that order, and the flat index above applies to
the block, not to the training tensor's storage.

The layout is derived from the model config alone, so trainer and actor agree on it without exchanging
tensors, and it is identified by a fingerprint (SHA-256 over its canonical JSON) that every manifest
carries.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import jsondoc
from aurora_store.codec.families import CONSTANT, EngineOnly, Family, NameSet, decoder_specs, engine_only
from aurora_store.codec.order import ElementOrder
from aurora_store.codec.segment import MAX_NAME_BYTES
from aurora_store.errors import LayoutCoverageError, LayoutError, UnsupportedDtypeError

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
    """One training tensor that occupies rows ``[row_offset, row_offset + rows)`` of an inference tensor, in
    storage order or, with an ``order``, in that element order (each training row one row of the block)."""

    train_name: str
    row_offset: int
    rows: int
    order: ElementOrder | None = None


@dataclass(frozen=True)
class InferenceTensor:
    """A tensor as the inference engine holds it, made of one or more stacked training tensors.

    Components tile the *row axis*: the first ``stack_dims`` dims taken together (1 for ordinary tensors;
    2 for ``[E, R, C]`` expert tensors stacked from per-expert ``[R_k, C]`` tensors)."""

    name: str
    shape: tuple[int, ...]
    components: tuple[Component, ...]
    dtype: str = "bfloat16"
    stack_dims: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row_size(self) -> int:
        """Elements per row of the row axis (dim 0 unless ``stack_dims`` > 1); 1 for vectors."""
        return math.prod(self.shape[self.stack_dims:])

    @property
    def rows(self) -> int:
        """Length of the row axis the components tile."""
        return math.prod(self.shape[: self.stack_dims])

    @property
    def is_fused(self) -> bool:
        return len(self.components) > 1

    def component_shape(self, component: Component) -> tuple[int, ...]:
        """The training tensor's own shape."""
        if component.order is not None:
            return component.order.shape
        return (component.rows, *self.shape[self.stack_dims:])

    def component_span(self, component: Component) -> tuple[int, int]:
        """Flat index range ``[lo, hi)`` that ``component`` occupies in this tensor."""
        lo = component.row_offset * self.row_size
        return lo, lo + component.rows * self.row_size

    def join(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """This tensor as the engine holds it, from its training tensors in ``state`` (new storage)."""
        parts = [state[c.train_name].reshape(self.component_shape(c)) if c.order is None else
                 c.order.to_engine(state[c.train_name]).reshape((c.rows, *self.shape[self.stack_dims:]))
                 for c in self.components]
        whole = parts[0].clone() if len(parts) == 1 else torch.cat(parts, dim=0)
        return whole.reshape(self.shape)

    def parts(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """The training tensors of ``full`` (this tensor as the engine holds it): views, except copies for
        components in an element order of their own."""
        full = full.reshape((self.rows, *self.shape[self.stack_dims:]))
        out = {}
        for comp in self.components:
            block = full[comp.row_offset: comp.row_offset + comp.rows]
            out[comp.train_name] = block if comp.order is None else comp.order.to_train(block)
        return out


@dataclass(frozen=True)
class ModelLayout:
    """The complete, ordered set of inference tensors of one model and where each training tensor goes.

    ``aliases`` lists training names that are the same tensor as another one (tied ``lm_head``): they are
    accepted in state dicts but never shipped twice. ``engine_only`` lists the engine parameters no training
    tensor makes: constants, and tensors the engine derives from a layout tensor after loading, which a write to
    that tensor must refresh (:class:`~aurora_store.codec.families.EngineOnly`).
    """

    tensors: tuple[InferenceTensor, ...]
    aliases: tuple[tuple[str, str], ...] = field(default=())
    engine_only: tuple[EngineOnly, ...] = field(default=())

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
            if not 1 <= tensor.stack_dims <= len(tensor.shape):
                raise LayoutError(f"{tensor.name}: stack_dims {tensor.stack_dims} outside [1, {len(tensor.shape)}]")
            expected = 0
            for comp in tensor.components:
                if comp.row_offset != expected or comp.rows < 0:
                    raise LayoutError(f"{tensor.name}: components must tile dim 0 in order")
                order = comp.order
                if order is not None and (order.shape[0] != comp.rows or order.numel != comp.rows * tensor.row_size):
                    raise LayoutError(f"{tensor.name}: {comp.train_name}'s element order over shape {order.shape} "
                                      f"does not fill its {comp.rows} rows of {tensor.row_size} elements")
                expected += comp.rows
            if expected != tensor.rows:
                raise LayoutError(f"{tensor.name}: components cover {expected} of {tensor.rows} rows")
        extra = [e.name for e in self.engine_only]
        if len(set(extra)) != len(extra) or set(extra) & set(names):
            raise LayoutError("an engine-only tensor is named twice or is also a layout tensor")
        for entry in self.engine_only:
            if (entry.source is None) != (entry.rule == CONSTANT) or (entry.source is not None
                                                                     and entry.source not in names):
                raise LayoutError(f"{entry.name}: a derived tensor needs a layout tensor as its source, a constant "
                                  f"none (rule {entry.rule!r}, source {entry.source!r})")

    @cached_property
    def derived_from(self) -> dict[str, tuple[EngineOnly, ...]]:
        """Layout tensor → the engine-only tensors derived from it (what a write to it must refresh)."""
        found: dict[str, list[EngineOnly]] = {}
        for entry in self.engine_only:
            if entry.source is not None:
                found.setdefault(entry.source, []).append(entry)
        return {name: tuple(entries) for name, entries in found.items()}

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
                    # An element order is a third entry, only where there is one (older fingerprints unchanged).
                    "components": [[c.train_name, c.rows, *([c.order.to_json()] if c.order else [])]
                                   for c in t.components],
                    # Written only when not 1, so layouts without expert stacking keep their fingerprints.
                    **({"stack_dims": t.stack_dims} if t.stack_dims != 1 else {}),
                }
                for t in self.tensors
            ],
            "aliases": [list(pair) for pair in self.aliases],
            # Written only where there are some, so other layouts keep their fingerprints.
            **({"engine_only": [[e.name, e.rule, e.source] for e in self.engine_only]} if self.engine_only else {}),
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
                for entry in t["components"]:
                    if not isinstance(entry, list) or len(entry) not in (2, 3):
                        raise LayoutError(f"a component is [name, rows] or [name, rows, order], not {str(entry)[:80]}")
                    rows = jsondoc.integer(entry[1], "component rows", LayoutError)
                    order = ElementOrder.from_json(entry[2]) if len(entry) == 3 else None
                    comps.append(Component(jsondoc.text(entry[0], "component name", LayoutError), offset, rows, order))
                    offset += rows
                shape = tuple(jsondoc.integer(d, "shape dimension", LayoutError) for d in t["shape"])
                stack_dims = jsondoc.integer(t.get("stack_dims", 1), "stack_dims", LayoutError)
                tensors.append(InferenceTensor(jsondoc.text(t["name"], "tensor name", LayoutError), shape,
                                               tuple(comps), jsondoc.text(t["dtype"], "dtype", LayoutError),
                                               stack_dims))
            aliases = tuple((jsondoc.text(a, "alias", LayoutError), jsondoc.text(b, "alias", LayoutError))
                            for a, b in doc.get("aliases", ()))
            extra = tuple(EngineOnly(jsondoc.text(name, "engine-only name", LayoutError),
                                     jsondoc.text(rule, "engine-only rule", LayoutError),
                                     None if src is None else jsondoc.text(src, "engine-only source", LayoutError))
                          for name, rule, src in doc.get("engine_only", ()))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"malformed layout document: {exc}") from exc
        return cls(tuple(tensors), aliases, extra)

    @cached_property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(canonical).hexdigest()

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dtype: str = "bfloat16", *, names: NameSet = "memory",
                    family: Family | None = None) -> ModelLayout:
        """Layout of a decoder of any family in :data:`~aurora_store.codec.families.FAMILIES` from its HF
        ``config.json``, with the trainer's tensor names of ``names``: ``"memory"`` (a transformers model's
        parameters, what a trainer holds) or ``"checkpoint"`` (a saved checkpoint's; they differ for MoE).
        ``family`` overrides the config's family facts."""
        specs, aliases = decoder_specs(config, names, family)
        tensors = []
        for spec in specs:
            comps, offset = [], 0
            for train_name, rows in spec.components:
                comps.append(Component(train_name, offset, rows, spec.order))
                offset += rows
            tensors.append(InferenceTensor(spec.name, spec.shape, tuple(comps), dtype, spec.stack_dims))
        return cls(tuple(tensors), aliases, engine_only(config, family))

    @classmethod
    def from_config_file(cls, path: str | Path, dtype: str = "bfloat16", *, names: NameSet = "memory") -> ModelLayout:
        try:
            config = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise LayoutError(f"cannot read model config {path}: {exc}") from exc
        if not isinstance(config, dict):
            raise LayoutError(f"model config {path} is not a JSON object")
        return cls.from_config(config, dtype, names=names)

    @classmethod
    def identity(cls, state: Mapping[str, torch.Tensor]) -> ModelLayout:
        """A layout that ships every tensor under its own name, unfused (for arbitrary checkpoints)."""
        tensors = []
        for name, tensor in state.items():
            shape = tuple(tensor.shape) if tensor.dim() else (1,)
            tensors.append(InferenceTensor(name, shape, (Component(name, 0, shape[0]),),
                                           dtype_name(tensor.dtype)))
        return cls(tuple(tensors))

    # --- coverage --------------------------------------------------------------------------------

    def check_coverage(self, trainable: Iterable[str], held: Iterable[str] | None = None) -> None:
        """Raise :class:`~aurora_store.errors.LayoutCoverageError` naming them unless every ``trainable``
        parameter name is shipped by this layout (or is a declared alias of one it ships) and every training
        tensor of the layout is among ``held`` (default: ``trainable``). A trainer calls this before its first
        publish, so an unsupported model fails at step 0, never by silently shipping part of the weights."""
        trainable = list(trainable)
        held_names = set(trainable if held is None else held)
        shipped = set(self.train_names) | {alias for alias, _ in self.aliases}
        uncovered = sorted(n for n in trainable if n not in shipped)
        unsourced = [n for n in self.train_names if n not in held_names]
        if uncovered or unsourced:
            parts = []
            if uncovered:
                parts.append(f"{len(uncovered)} trainable parameters no layout tensor ships: {uncovered[:8]}")
            if unsourced:
                parts.append(f"{len(unsourced)} layout tensors the model does not hold: {unsourced[:8]}")
            raise LayoutCoverageError("model and layout do not cover each other: " + "; ".join(parts),
                                      uncovered=uncovered, unsourced=unsourced)

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
        """Yield ``(inference tensor, flat offset, flat 16-bit bits in engine order)`` for every training tensor,
        in layout order, without materialising fused tensors (a view of each, or a copy of one in an element
        order of its own)."""
        self.check_state(state)
        for tensor in self.tensors:
            for comp in tensor.components:
                lo, _ = tensor.component_span(comp)
                yield tensor, lo, engine_bits(comp, state[comp.train_name])

    def fuse(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inference-layout tensors (new storage for fused ones) from training-layout ``state``."""
        self.check_state(state)
        return {tensor.name: tensor.join(state) for tensor in self.tensors}

    def split(self, fused: Mapping[str, torch.Tensor], *, include_aliases: bool = False) -> dict[str, torch.Tensor]:
        """Training-layout tensors from inference-layout ``fused`` tensors: views, except copies for
        components in an element order of their own."""
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
            out.update(tensor.parts(full))
        if include_aliases:
            for alias, target in self.aliases:
                out[alias] = out[target]
        return out


def bits_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat int16 view of their bit patterns (no copy when contiguous)."""
    dtype_name(tensor.dtype)
    return tensor.detach().contiguous().view(torch.int16).reshape(-1)


def engine_bits(component: Component, tensor: torch.Tensor) -> torch.Tensor:
    """The flat 16-bit patterns of training tensor ``component`` (or a run of its rows: a rank's shard) in the
    engine's element order: a view in storage order, a copy in an element order of the component's own."""
    bits = bits_view(tensor)
    return bits if component.order is None else component.order.to_engine(bits)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits_view(a), bits_view(b)))
