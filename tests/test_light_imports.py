"""Processes that only pass digests and manifests along start without torch, numpy's kernels or numba.

A relay, the test servers' launchers (the WAN benchmark starts one per server in each network namespace) and the
control plane paid 2.5-3 CPU-seconds of imports per start before the codec's light modules were split from its
tensor code."""

from __future__ import annotations

import subprocess
import sys

import pytest

import aurora_store.codec as codec

HEAVY = ("torch", "numba", "safetensors")


@pytest.mark.parametrize("modules", [
    ["workers.relay.relay", "workers.relay.cli"],
    ["aurora_store.testing.servers"],
    ["aurora_store.bus", "aurora_store.store", "aurora_store.store.snapshot_manifest", "aurora_store.codec.manifest"],
])
def test_light_processes_do_not_import_the_tensor_stack(modules):
    probe = f"import sys\nimport {', '.join(modules)}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"{modules} imported {loaded}"


def test_every_codec_export_resolves_to_its_module():
    for name in codec.__all__:
        value = getattr(codec, name)
        assert getattr(value, "__name__", name) == name or not callable(value)
    assert set(codec.__all__) <= set(dir(codec))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        codec.nope  # noqa: B018
