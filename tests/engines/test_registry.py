"""The engine registry: builtins by name without importing them, engines registered in process or through the
``aurora.engines`` entry-point group, typed refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aurora_store.codec import ModelLayout
from aurora_store.errors import ConfigError
from aurora_store.testing.builders import TINY_QWEN3
from workers.engines import EngineOptions, load_engine, register_engine, registered_engines
from workers.engines import registry as registry_module

ROOT = Path(__file__).resolve().parents[2]


class FakeEngine:
    """Only what the registry hands over is checked here (a real engine needs a real snapshot)."""

    name = "fake"

    def __init__(self, model_dir: Path, layout: ModelLayout, *, seed: int, options: EngineOptions) -> None:
        self.model_dir, self.layout, self.seed, self.options = model_dir, layout, seed, options


@pytest.fixture()
def clean_registry(monkeypatch):
    """Each test sees the builtins only (and restores the process's registry after)."""
    monkeypatch.setattr(registry_module, "_registered", {})
    monkeypatch.setattr(registry_module, "_discovered", None)


def test_the_package_imports_no_engine():
    probe = ("import sys, workers.engines as e; print(e.registered_engines()); "
             "print(sorted(m for m in sys.modules if m.startswith(('workers.', 'vllm', 'transformers'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, modules = out.stdout.strip().splitlines()
    assert "'torch'" in names and "'vllm'" in names
    assert eval(modules) == ["workers.engines", "workers.engines.base", "workers.engines.registry"]


def test_registered_factories_get_the_engine_arguments(clean_registry, tmp_path):
    register_engine("fake", FakeEngine)
    assert "fake" in registered_engines() and {"torch", "vllm"} <= set(registered_engines())
    layout = ModelLayout.from_config(TINY_QWEN3)
    engine = load_engine("fake", tmp_path, layout, seed=7, options=EngineOptions(device="cpu"))
    assert isinstance(engine, FakeEngine)
    assert (engine.model_dir, engine.layout, engine.seed, engine.options.device) == (tmp_path, layout, 7, "cpu")
    assert load_engine("fake", str(tmp_path), layout).options == EngineOptions()  # defaults, Path


def test_names_are_not_silently_replaced(clean_registry):
    with pytest.raises(ConfigError, match="already registered"):
        register_engine("torch", FakeEngine)
    register_engine("torch", FakeEngine, replace=True)
    assert registry_module._registered["torch"] is FakeEngine
    with pytest.raises(ConfigError):
        register_engine("", FakeEngine)


def test_unknown_and_unloadable_engines_are_typed(clean_registry, tmp_path):
    layout = ModelLayout.from_config(TINY_QWEN3)
    with pytest.raises(ConfigError, match=r"unknown engine 'nope'.*torch"):
        load_engine("nope", tmp_path, layout)
    register_engine("broken", "tests.engines.no_such_module:Engine")
    with pytest.raises(ConfigError, match="cannot load"):
        load_engine("broken", tmp_path, layout)
    register_engine("malformed", "no_colon_here")
    with pytest.raises(ConfigError, match="module:attr"):
        load_engine("malformed", tmp_path, layout)


def test_an_installed_distribution_adds_engines_by_entry_point(clean_registry, tmp_path, monkeypatch):
    """What ``[project.entry-points."aurora.engines"]`` in a user's package creates, found by name."""
    dist = tmp_path / "my_engines-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-engines\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[aurora.engines]\n"
                                           "fake = tests.engines.test_registry:FakeEngine\n"
                                           "torch = somewhere.else:Engine\n")  # a builtin is not shadowed
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "fake" in registered_engines()
    engine = load_engine("fake", tmp_path, ModelLayout.from_config(TINY_QWEN3), seed=1)
    assert type(engine).__name__ == "FakeEngine"
    assert registry_module._entry_points_locked().get("torch") is None
