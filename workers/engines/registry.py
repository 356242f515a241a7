"""Engines by name: ``--engine NAME`` resolves here, so adding an engine is registering it, not editing an
if/else (as vLLM's weight-transfer ``register_engine`` or fsspec's ``register_implementation`` do).

Three sources, looked up in this order: engines registered in this process (:func:`register_engine`),
the ``aurora.engines`` entry-point group of installed distributions (``name = "package.module:attr"``), and
the builtins below. Implementations are named by ``"module:attr"`` strings and imported only when an engine
of that name is loaded: this package never imports an engine (vLLM is heavy and optional).
"""

from __future__ import annotations

import logging
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import cast

from aurora_store import plugins
from aurora_store.codec import ModelLayout
from aurora_store.errors import ConfigError
from workers.engines.base import Engine, EngineFactory, EngineOptions

log = logging.getLogger("aurora.engines")

#: Entry-point group a distribution declares its engines in (``[project.entry-points."aurora.engines"]``).
ENTRY_POINT_GROUP = "aurora.engines"
#: The shipped engines; each attr is called as ``factory(model_dir, layout, seed=, options=)``.
BUILTINS: dict[str, str] = {
    "torch": "workers.engines.torch_engine:TorchEngine.from_options",
    "vllm": "workers.vllm.engine:VllmEngine.from_options",
}

_lock = threading.Lock()
_registered: dict[str, EngineFactory | str] = {}
_discovered: dict[str, str] | None = None  # entry points, read once


def register_engine(name: str, factory: EngineFactory | str, *, replace: bool = False) -> None:
    """Make ``--engine name`` build engines with ``factory`` (a callable, or a ``"module:attr"`` string
    imported on first use). Registering a name that exists (registered, an entry point or a builtin) needs
    ``replace=True``."""
    if not name or not isinstance(name, str):
        raise ConfigError(f"an engine name must be a non-empty string, not {name!r}")
    with _lock:
        if not replace and name in _names_locked():
            raise ConfigError(f"an engine named {name!r} is already registered (replace=True to override it)")
        _registered[name] = factory


def registered_engines() -> tuple[str, ...]:
    """Every engine name that :func:`load_engine` accepts, sorted."""
    with _lock:
        return tuple(sorted(_names_locked()))


def load_engine(name: str, model_dir: Path, layout: ModelLayout, *, seed: int = 0,
                options: EngineOptions | None = None) -> Engine:
    """Build the engine registered as ``name`` over the snapshot in ``model_dir``."""
    with _lock:
        spec = _registered.get(name) or _entry_points_locked().get(name) or BUILTINS.get(name)
        known = sorted(_names_locked())
    if spec is None:
        raise ConfigError(f"unknown engine {name!r} (registered: {', '.join(known)})")
    factory = _resolve(name, spec) if isinstance(spec, str) else spec
    return factory(Path(model_dir), layout, seed=seed, options=options or EngineOptions())


def _names_locked() -> set[str]:
    return {*_registered, *_entry_points_locked(), *BUILTINS}


def _entry_points_locked() -> dict[str, str]:
    global _discovered
    if _discovered is None:
        _discovered = {}
        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name in BUILTINS and point.value != BUILTINS[point.name]:
                log.warning("ignoring entry point %s = %s: %r is a builtin engine (register_engine(..., "
                            "replace=True) overrides it)", point.name, point.value, point.name)
                continue
            _discovered[point.name] = point.value
    return _discovered


def _resolve(name: str, spec: str) -> EngineFactory:
    """``"package.module:attr.attr"`` → the factory (the attribute path may name a classmethod)."""
    return cast(EngineFactory, plugins.resolve(spec, f"engine {name!r}"))
