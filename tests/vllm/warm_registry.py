"""``python -m tests.vllm.warm_registry``: fill vLLM's model-info cache for every architecture the suite's tiny
models declare, before the tests run (``make test-prerequisites``).

The first time vLLM meets an architecture on a machine it inspects the model class in a subprocess of its own
(a fresh interpreter importing torch and vLLM: ~9 CPU-s each here) and caches the answer under
``$VLLM_CACHE_ROOT/modelinfos``, keyed by the model file's hash. CI always starts on a fresh machine, so the
suite paid that for ~11 architectures inside its timed run: the layout-coverage probe, which loads every
family, took 161 CPU-s with the cache cold against 72 with it warm. Here they are inspected in this one
process, beside the rest of the prerequisites: vLLM's subprocess exists so that its caller never initialises
CUDA, and this process does nothing else (the same inspection; vLLM's plugins loaded first, as its subprocess
does). Prints one JSON object: architecture → seconds, or the error (reported, not fatal: the tests that load
that architecture say what is wrong).
"""

from __future__ import annotations

import json
import sys
import time

from tests.vllm.tiny_families import FAMILIES, VARIANTS, config_of

#: vLLM also consults its Transformers fallback's class while resolving an architecture.
ALSO = ("TransformersForCausalLM",)


def architectures() -> list[str]:
    """Every architecture a tiny family or variant of the suite declares, and :data:`ALSO`."""
    names = [arch for family in [*FAMILIES, *VARIANTS] for arch in config_of(family).get("architectures", ())]
    return list(dict.fromkeys([*names, *ALSO]))


def _inspect_here() -> None:
    """Have vLLM's registry run its inspections in this process (if this vLLM still inspects through
    ``_run_in_subprocess``; otherwise they run as vLLM does, only slower)."""
    from vllm.model_executor.models import registry
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    if callable(getattr(registry, "_run_in_subprocess", None)):
        registry._run_in_subprocess = lambda fn: fn()


def _inspect(arch: str) -> float | str:
    from vllm import ModelRegistry

    registered = ModelRegistry.models.get(arch)
    if registered is None:
        return "not registered with this vLLM"
    started = time.monotonic()
    try:
        registered.inspect_model_cls()  # cached on disk from now on
    except Exception as exc:  # reported per architecture; the tests that load it will fail with the cause
        return f"{type(exc).__name__}: {exc}"[-500:]
    return round(time.monotonic() - started, 2)


def main() -> int:
    _inspect_here()
    json.dump({arch: _inspect(arch) for arch in architectures()}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
