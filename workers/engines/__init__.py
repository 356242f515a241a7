# TEMPORARY shim until the engines package lands
from workers.actor.engine import Completion, Engine, EngineOptions, load_engine, torch_device  # noqa: F401
