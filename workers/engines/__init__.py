"""Inference engines for actors: the :class:`Engine` Protocol and the registry ``--engine`` resolves through.

Implementations (``torch``: :mod:`workers.engines.torch_engine`; ``vllm``: :mod:`workers.vllm.engine`; any
registered or installed through the ``aurora.engines`` entry-point group) are imported only when loaded.
"""

from workers.engines.base import Completion, Engine, EngineFactory, EngineOptions, torch_device
from workers.engines.registry import ENTRY_POINT_GROUP, load_engine, register_engine, registered_engines

__all__ = [
    "ENTRY_POINT_GROUP", "Completion", "Engine", "EngineFactory", "EngineOptions", "load_engine",
    "register_engine", "registered_engines", "torch_device",
]
