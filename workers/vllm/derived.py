"""Engine tensors vLLM derives from a layout tensor after loading, recomputed after every write that touches it.

A layout declares such tensors (:class:`~aurora_store.codec.families.EngineOnly`: name, rule, source); the rule
names an entry of :data:`REFRESHERS`, so a new kind of derived tensor is one registry entry here, not a branch on
the model's type in the activation path. Binding checks that every declared rule is registered and applies to the
module that holds the tensor (:func:`bind_refreshes`); after a write, :meth:`Refreshes.after_write` runs each
affected module's rule once.

``mla_absorb`` (DeepSeek-V2/V3's multi-head latent attention): vLLM's ``MLAAttention.process_weights_after_loading``
splits ``kv_b_proj`` into the absorbed ``W_UK_T`` and ``W_UV`` its decode path multiplies by, and copies them into
the existing parameters (``replace_parameter(..., prefer_copy=True)``, which keeps their storage). That method is
idempotent on the reference CPU backend and on GPU backends without weight packing, so the refresh *is* vLLM's own
code path, run again on the new ``kv_b_proj``: what the engine holds afterwards is exactly what a fresh load of
the same weights computes. vLLM's AMX MLA backend instead packs private copies and frees ``kv_b_proj`` (shape
``[0]``), so nothing could be written or refreshed in place: binding refuses it, saying so. (On vLLM 0.32's
unquantized path the absorbed tensors are views of ``kv_b_proj.weight``'s own storage, so a write already reaches
them and the refresh re-copies the same bytes; backends that dequantize, cast or pack hold copies, which only the
refresh updates — ``tests/vllm/test_mla_activation.py`` checks both.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from aurora_store.codec.families import CONSTANT
from aurora_store.codec.layout import ModelLayout

#: A rule's check of the module holding a derived tensor: ``None`` if the rule can refresh it, else why not.
Check = Callable[[torch.nn.Module], str | None]
#: A rule's refresh of that module (after its source tensor was written in place).
Refresh = Callable[[torch.nn.Module], None]


@dataclass(frozen=True)
class Refresher:
    check: Check
    refresh: Refresh


def _mla_check(module: torch.nn.Module) -> str | None:
    try:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    except ImportError:  # a vLLM without MLA
        return "this vLLM has no MLAAttention"
    if not isinstance(module, MLAAttention):
        return f"is held by a {type(module).__name__}, not vLLM's MLAAttention"
    if getattr(module, "is_amx_bmm_enabled", False):
        return ("vLLM's AMX MLA backend packs W_UK/W_UV into private copies and frees kv_b_proj, so in-place writes "
                "cannot reach them (start the engine with the CPU_MLA attention backend)")
    if any(getattr(module, flag, False) for flag in ("is_aiter_triton_fp4_bmm_enabled",
                                                     "is_aiter_triton_fp8_bmm_enabled", "dcp_q_replicate")):
        return "this MLA backend quantizes or gathers the absorbed tensors; their refresh is not proven"
    return None


def _mla_refresh(module: torch.nn.Module) -> None:
    # vLLM's own derivation, run again: the activation dtype it was given at load is the absorbed tensors' dtype.
    with torch.no_grad():
        module.process_weights_after_loading(module.W_UV.dtype)  # type: ignore[operator]


#: rule name → how to check and refresh the module holding a tensor derived by that rule.
REFRESHERS: dict[str, Refresher] = {
    "mla_absorb": Refresher(_mla_check, _mla_refresh),
}


@dataclass(frozen=True)
class Refreshes:
    """Per layout tensor, the modules (name, rule) to refresh after it is written."""

    by_source: dict[str, tuple[tuple[str, str], ...]]

    def after_write(self, model: torch.nn.Module, written: Iterable[str]) -> int:
        """Refresh every module derived from a tensor in ``written`` (each once); returns how many."""
        modules: dict[str, str] = {}
        for name in written:
            for module, rule in self.by_source.get(name, ()):
                modules.setdefault(module, rule)
        for module, rule in modules.items():
            REFRESHERS[rule].refresh(model.get_submodule(module))
        return len(modules)


def bind_refreshes(layout: ModelLayout, model: torch.nn.Module) -> tuple[Refreshes, list[str]]:
    """``(refreshes, problems)`` for the layout's derived tensors in ``model`` (no problems = all refreshable)."""
    problems: list[str] = []
    by_source: dict[str, list[tuple[str, str]]] = {}
    for entry in layout.engine_only:
        if entry.rule == CONSTANT or entry.source is None:
            continue
        refresher = REFRESHERS.get(entry.rule)
        if refresher is None:
            problems.append(f"{entry.name}: derived by rule {entry.rule!r}, which no refresher is registered for")
            continue
        module_name = entry.name.rpartition(".")[0]
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            problems.append(f"{entry.name}: no module {module_name!r} holds it")
            continue
        why = refresher.check(module)
        if why is not None:
            problems.append(f"{entry.name}: derived from {entry.source} after loading, but {why}")
            continue
        pairs = by_source.setdefault(entry.source, [])
        if (module_name, entry.rule) not in pairs:
            pairs.append((module_name, entry.rule))
    return Refreshes({k: tuple(v) for k, v in by_source.items()}), problems
