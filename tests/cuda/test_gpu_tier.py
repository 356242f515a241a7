"""The GPU tier: the trainer's step with its CUDA defaults, a whole run (trainer and torch actors on the GPU),
the torch engine activating deltas on the GPU and the codec's device extraction on CUDA tensors.

``pytest -m cuda`` on a GPU machine; skipped (with the reason) where torch sees no CUDA device."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, apply_delta, digest_state
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state
from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig, Sample
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.trainer import memory
from workers.trainer.cli import resolve_activation_checkpointing, resolve_optimizer
from workers.trainer.device import autocast_dtype, configure_compute
from workers.trainer.learner import ShardedLearner

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU: torch sees none (CPU-only build or no driver)")]

CUDA = torch.device("cuda", 0)
MODEL = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32768, "tie_word_embeddings": False,
         "max_position_embeddings": 1024}


def _samples(n: int, prompt: int, completion: int, vocab: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(3, vocab, (prompt + completion,), generator=gen).tolist()
        out.append(Sample(tuple(ids[:prompt]), tuple(ids[prompt:]), tuple([-2.0] * completion), float(i % 2),
                          f"g{i // 4}"))
    return out


def test_trainer_step_with_the_cuda_defaults_trains_and_matches_its_memory_plan():
    configure_compute(CUDA)
    optimizer = resolve_optimizer("auto", "cuda", 1)
    assert optimizer == "adamw-bf16" and resolve_activation_checkpointing("auto", "cuda")
    model = build_model({**DEFAULT_CONFIG, **MODEL}, seed=0).to(CUDA)
    published = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = ShardedLearner(model, GRPOConfig(lr=1e-4, epochs=2), Ranks(), optimizer=optimizer,
                             autocast=autocast_dtype(CUDA, "bfloat16", 1), activation_checkpointing=True,
                             logits_chunk=1024)
    samples = _samples(16, 128, 384, MODEL["vocab_size"])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    stats = learner.step(samples)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    assert stats.tokens == 16 * 384 and torch.isfinite(torch.tensor(stats.loss)) and stats.grad_norm > 0
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    shape = memory.ModelShape.from_config({**DEFAULT_CONFIG, **MODEL})
    planned = memory.plan(shape, memory.Batch(16, 512, 384), replace(memory.NEW, logits_chunk=1024),
                          device="cpu").per_gpu_bytes  # the allocator's bytes: no context reserve
    assert abs(peak - planned) <= 0.15 * peak, (peak, planned)
    del published


@pytest.mark.redis
@pytest.mark.slow
def test_a_whole_run_with_trainer_and_torch_actors_on_the_gpu(tmp_path):
    from workers.cluster import ClusterSpec, LocalCluster

    spec = ClusterSpec(run_dir=tmp_path, steps=4, batch_size=8, group_size=4, actors={"home": 1},
                       trainer_args=["--device", "cuda", "--warm-start-steps", "20"],
                       actor_args=["--device", "cuda", "--verify-full-digest"])
    cluster = LocalCluster(spec).start()
    try:
        summary = cluster.wait_trainer_done(timeout=300)
        final = summary["trainer_version"]
        assert final == 4
        cluster.wait_actors_on(final, 60)
        store = cluster.store()
        assert store.versions() == [1, 2, 3, 4]
    finally:
        cluster.stop()


def test_torch_engine_activates_deltas_on_the_gpu(tmp_path):
    from workers.engines.torch_engine import TorchEngine
    from workers.rl.model import side_files
    from workers.rl.task import build_tokenizer

    model = build_model(DEFAULT_CONFIG, seed=0)
    model.save_pretrained(tmp_path)
    for name, data in side_files(DEFAULT_CONFIG, build_tokenizer()).items():
        if name != "config.json":
            (tmp_path / name).write_bytes(data)
    layout = ModelLayout.from_config(DEFAULT_CONFIG)
    engine = TorchEngine(tmp_path, layout, device=CUDA, version=0)
    assert next(engine.model.parameters()).device.type == CUDA.type
    groups = engine.generate(["1+2="], 2, 4, 1.0, seed=0)  # sampling on the GPU (before random bit flips)
    assert len(groups) == 1 and len(groups[0]) == 2
    old = {n: p.detach().cpu() for n, p in engine.model.named_parameters()}
    new = perturb(old, fraction=0.03, seed=1)
    manifest, segments = encode(layout, old, new, 1, 0, digest_state(layout, old), CodecParams(segment_bytes=4096))
    apply_delta(manifest, blobs(segments), engine.target)
    engine.weights_changed()
    assert engine.target.digest == digest_state(layout, new)
    for name, param in engine.model.named_parameters():
        assert torch.equal(param.detach().cpu().view(torch.int16), new[name].view(torch.int16)), name


def _encoded_on_host_and_device(layout: ModelLayout, seed: int):
    """A random state and a 5 % perturbation of it (seeds ``seed``, ``seed + 1``): the new state, both states on
    the GPU, and version 1 encoded from the host tensors and from the GPU tensors."""
    old = random_state(layout, seed=seed)
    new = perturb(old, fraction=0.05, seed=seed + 1)
    params = CodecParams(segment_bytes=4096)
    on_gpu = ({n: t.to(CUDA) for n, t in old.items()}, {n: t.to(CUDA) for n, t in new.items()})
    host = encode(layout, old, new, 1, 0, digest_state(layout, old), params, extraction="host")
    device = encode(layout, *on_gpu, 1, 0, digest_state(layout, old), params, extraction="device")
    return new, on_gpu, host, device


def test_codec_device_extraction_on_cuda_tensors_is_byte_identical_to_the_host():
    layout = ModelLayout.from_config({**TINY_QWEN3, "tie_word_embeddings": False})
    new, on_gpu, host, device = _encoded_on_host_and_device(layout, seed=5)
    assert device[0].to_bytes() == host[0].to_bytes()
    assert [s.data for s in device[1]] == [s.data for s in host[1]]
    target = TensorTarget.from_state(layout, {n: t.clone() for n, t in on_gpu[0].items()}, version=0)
    apply_delta(device[0], blobs(device[1]), target)
    assert target.digest == digest_state(layout, new)


def test_transposed_experts_encode_and_apply_on_cuda_tensors_as_on_the_host():
    """gpt-oss's expert tensors (stored transposed against the engine's): the device extraction reorders them on
    the GPU byte-identically to the host, a target over CUDA tensors writes through the element order's position
    map, and the map computed from device indices is the host's."""
    gpt_oss = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "intermediate_size": 48, "num_hidden_layers": 2, "vocab_size": 37,
               "num_local_experts": 3, "attention_bias": True}
    layout = ModelLayout.from_config(gpt_oss)
    new, on_gpu, host, device = _encoded_on_host_and_device(layout, seed=7)
    assert [s.data for s in device[1]] == [s.data for s in host[1]]
    state = {n: t.clone() for n, t in on_gpu[0].items()}
    target = TensorTarget.from_state(layout, state, version=0)
    apply_delta(host[0], blobs(host[1]), target)
    assert target.digest == digest_state(layout, new)
    for name, tensor in state.items():
        assert torch.equal(tensor.cpu().view(torch.int16), new[name].view(torch.int16)), name
    order = layout["model.layers.0.mlp.experts.routed_experts.w13_weight"].components[0].order
    positions = torch.arange(order.numel)
    assert torch.equal(order.train_index(positions.to(CUDA)).cpu(), order.train_index(positions))


@pytest.mark.parametrize("case", ["value_classes", "sparse_blocks"])
def test_device_encoding_on_cuda_tensors_gives_the_host_encoders_bytes(case, monkeypatch):
    """The device encoding (tests/codec/test_device_encode.py on CPU) on CUDA tensors: every value class and
    special bit pattern, chunk cuts every 1365 changes, and a sparse 2^22-element piece compared in 64 blocks
    (the count pass, ``nonzero_static``), all byte-identical to the host encoder, the digest move included."""
    import numpy as np

    from aurora_store.codec import DeltaEncoder, Piece
    from aurora_store.codec import extract as extract_module
    from tests.codec.test_device_encode import sparse_pair, value_class_pair

    old, new, changes = value_class_pair() if case == "value_classes" else sparse_pair()
    if case == "sparse_blocks":
        monkeypatch.setattr(extract_module, "MASK_BLOCK", 1 << 16)
    layout = ModelLayout.identity({"w": torch.zeros(old.size, dtype=torch.bfloat16)})
    tensor = layout.tensors[0]
    outs = []
    for extraction, device in (("host", torch.device("cpu")), ("device", CUDA)):
        for params in (CodecParams(segment_bytes=4096), CodecParams(segment_bytes=4096, values="raw")):
            a, b = (torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in (old, new))
            encoder = DeltaEncoder(layout, params, extraction=extraction)
            segments = list(encoder.segments([Piece(tensor, 0, a, b)]))
            outs.append(([s.data for s in segments], [s.ref for s in segments], encoder.summary.changed,
                         encoder.summary.digest_delta))
    assert outs[:2] == outs[2:]
    assert outs[0][2] == {"w": changes} and sum(len(ref.chunks) for ref in outs[0][1]) >= 3
