"""A plain PyTorch/transformers engine: the HuggingFace model in bf16, sampled with ``generate``.

Deltas are scattered into the model's own q/k/v and gate/up parameters through a split-layout
:class:`WeightTarget` (the fused flat index is mapped onto the separate tensors) — no copies.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from aurora_store.codec import ModelLayout, TensorTarget
from workers.engines.base import Completion, EngineOptions, torch_device
from workers.rl.model import load_model, load_tokenizer


class TorchEngine:
    name = "torch"

    def __init__(self, model_dir: Path, layout: ModelLayout, *, seed: int = 0, version: int | None = None,
                 device: str | torch.device = "cpu") -> None:
        # The weights live on ``device`` (e.g. cuda:0); deltas are scattered there in place.
        self.device = torch.device(device)
        self.model = load_model(model_dir, dtype=torch.bfloat16).to(self.device).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.tokenizer = load_tokenizer(model_dir)
        self.target = TensorTarget.from_state(layout, dict(self.model.named_parameters()), version=version)
        self.seed = seed

    @classmethod
    def from_options(cls, model_dir: Path, layout: ModelLayout, *, seed: int, options: EngineOptions) -> TorchEngine:
        """The registry's factory (``--engine torch``): only ``options.device`` applies."""
        return cls(model_dir, layout, seed=seed, device=torch_device(options.device))

    @torch.inference_mode()
    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Completion]]:
        expanded = [p for p in prompts for _ in range(group_size)]
        enc = self.tokenizer(expanded, return_tensors="pt", padding=True, padding_side="left").to(self.device)
        torch.manual_seed(seed)
        out = self.model.generate(
            **enc, do_sample=True, temperature=temperature, top_k=None, top_p=None, max_new_tokens=max_new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id)
        new_tokens = out.sequences[:, enc.input_ids.shape[1]:]
        steps = torch.stack(out.logits, dim=1).float() / temperature  # [n, T, vocab]
        logprobs = F.log_softmax(steps, dim=-1).gather(-1, new_tokens[:, : steps.shape[1], None]).squeeze(-1)
        eos = self.tokenizer.eos_token_id
        groups: list[list[Completion]] = []
        for i, row in enumerate(new_tokens.tolist()):
            length = row.index(eos) + 1 if eos in row else len(row)
            ids = tuple(row[:length])
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completion = Completion(ids, tuple(logprobs[i, :length].tolist()), text)
            if i % group_size == 0:
                groups.append([])
            groups[-1].append(completion)
        return groups

    def weights_changed(self) -> None:
        """HF modules read their parameters directly: nothing derived to refresh."""

    def close(self) -> None:
        del self.model
