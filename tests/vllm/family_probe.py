"""``python -m tests.vllm.family_probe {qwen2,llama}``: bootstrap a vLLM engine from a small model of that
family, check its parameters are exactly the codec layout, apply one delta in place, and print one JSON line.
Run in a subprocess by ``test_model_families`` (one in-process engine per process)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from aurora_store.codec import ModelLayout, activate, digest_state, stage
from aurora_store.codec.layout import bits_view
from aurora_store.testing.builders import blobs, encode
from workers.rl.model import DEFAULT_CONFIG, build_model, side_files
from workers.rl.task import build_tokenizer

FAMILIES = {
    # Qwen2 always has q/k/v biases (fused into qkv_proj.bias); tied embeddings.
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True},
    # Llama with a separate (vocabulary-padded) lm_head.
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False},
}


def probe(family: str) -> dict:
    config = {k: v for k, v in DEFAULT_CONFIG.items() if k != "head_dim"}  # head_dim = hidden / heads = 32
    config.update(FAMILIES[family])
    layout = ModelLayout.from_config(config)
    params = dict(build_model(config, dtype=torch.bfloat16).named_parameters())
    state = {n: params[n].detach().contiguous() for n in layout.train_names}
    from workers.vllm.engine import VllmEngine

    with tempfile.TemporaryDirectory() as tmp:
        save_file(state, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        for name, data in side_files(config, build_tokenizer()).items():
            (Path(tmp) / name).write_bytes(data)
        engine = VllmEngine(Path(tmp), layout, seed=0, version=0)
        try:
            shapes = {name: list(shape) for name, shape, _ in engine.parameters()}
            boot = engine.target.digest == digest_state(layout, state)
            new = {k: (bits_view(v) + (torch.arange(v.numel()) % 13 == 0).to(torch.int16)).view(torch.bfloat16)
                   .reshape(v.shape) for k, v in state.items()}
            manifest, segments = encode(layout, state, new, 1, 0, engine.target.digest)
            activate(stage(manifest, blobs(segments), engine.target), engine.target)
            engine.weights_changed()
            expected = {n: bits_view(t) for n, t in layout.fuse(new).items()}
            exact = all(torch.equal(b, expected[n]) for n, b in engine.target.read(layout.names).items())
            after = str(engine.target.full_digest()) == manifest.weights_digest
        finally:
            engine.close()
    return {"family": family, "layout": {t.name: list(t.shape) for t in layout.tensors}, "engine": shapes,
            "bootstrap_digest_ok": boot, "delta_bit_exact": exact, "delta_digest_ok": after}


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    print(json.dumps(probe(sys.argv[1])))
