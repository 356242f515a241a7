"""Shared fixtures of the vLLM tests: a published run (snapshot + a chain of real Adam-step deltas in a local
bucket, built once per session) and a multiprocess vLLM engine bootstrapped from its snapshot, shared by all
tests of a module (an engine costs ~20 s to start on two CPU cores)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from aurora_store.codec import ModelLayout, WeightsDigest, digest_state
from aurora_store.codec.namesets import snapshot_layout
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshots import load_snapshot, write_snapshot
from aurora_store.testing.builders import publish
from tests.vllm.helpers import CHAIN
from workers.publish.snapshot import held_constants
from workers.rl.model import DEFAULT_CONFIG, build_model, side_files, warm_start
from workers.rl.task import AdditionTask, build_tokenizer


@dataclass
class PublishedRun:
    store: DeltaStore
    layout: ModelLayout
    states: list[dict[str, torch.Tensor]]  # the published bf16 policy (training names) of every version
    digests: list[WeightsDigest]
    snapshot_dir: Path  # snapshot 0 as an actor downloads it (loads into vLLM and transformers)


def adam_steps(model, tokenizer, task: AdditionTask, steps: int, optimizer: torch.optim.Optimizer,
               rng: random.Random) -> None:
    """Supervised steps on the addition task with a persistent AdamW — real optimiser updates, like GRPO's."""
    examples = task.examples(rng)
    model.train()
    for _ in range(steps):
        texts = [p + a + tokenizer.eos_token for p, a in (next(examples) for _ in range(32))]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        labels = enc.input_ids.clone()
        labels[enc.attention_mask == 0] = -100
        model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def publish_run(root: Path, config: dict, *, chain: int = CHAIN, warm_steps: int = 150) -> PublishedRun:
    """A snapshot of ``config``'s model (after ``warm_steps`` supervised steps) and ``chain`` versions of real
    AdamW steps published on top of it in a local bucket under ``root``."""
    store = DeltaStore(open_bucket(str(root / "bucket"), create=True))
    layout = ModelLayout.from_config(config)
    tokenizer = build_tokenizer()
    task = AdditionTask()
    model = build_model(config, seed=0)
    # A short warm start makes greedy decoding decisive (no near-ties between engines' roundings).
    warm_start(model, tokenizer, task, warm_steps, seed=0)

    def cast() -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        return {n: params[n].detach().to(torch.bfloat16).contiguous() for n in layout.train_names}

    states = [cast()]
    digests = [digest_state(layout, states[0])]
    # As the trainer writes it: the names the engine's loader reads, and the constants it loads beside them.
    write_snapshot(store, 0, states[0], layout, digests[0], extra_files=side_files(config, tokenizer),
                   files_layout=snapshot_layout(config), constants=held_constants(model, layout))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(1)
    for version in range(1, chain + 1):
        adam_steps(model, tokenizer, task, 2, optimizer, rng)
        states.append(cast())
        report = publish(store, layout, states[-2], states[-1], version, digests[-1])
        digests.append(WeightsDigest.parse(store.manifest(version).weights_digest))
        assert report is not None
        assert digests[-1] == digest_state(layout, states[-1])
    snapshot_dir = root / "snapshot-0"
    load_snapshot(store, 0, layout, download_dir=snapshot_dir)
    return PublishedRun(store, layout, states, digests, snapshot_dir)


@pytest.fixture(scope="session")
def published_run(tmp_path_factory) -> PublishedRun:
    return publish_run(tmp_path_factory.mktemp("vllm-run"), DEFAULT_CONFIG)


@contextmanager
def in_process_engine(snapshot_dir: Path, layout: ModelLayout) -> Iterator:
    """A vLLM engine whose worker runs in this process (its parameters can be read raw from here), at version 0,
    closed on exit."""
    import vllm.envs as envs

    from workers.vllm.engine import VllmEngine

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    envs.disable_envs_cache()
    try:
        engine = VllmEngine(snapshot_dir, layout, seed=0, version=0)
    finally:
        # vLLM caches its environment once an in-process engine exists: later engines must see the real one.
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
        envs.disable_envs_cache()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def mp_engine(published_run) -> Iterator:
    """One vLLM engine with V1 multiprocessing (the engine core in its own process), at version 0. KV blocks
    of 32 tokens (the CPU default is 128, longer than this model's context) make prefix caching observable."""
    from workers.vllm.engine import VllmEngine

    engine = VllmEngine(published_run.snapshot_dir, published_run.layout, seed=0, version=0, block_size=32)
    try:
        yield engine
    finally:
        engine.close()
