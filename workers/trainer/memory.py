"""The trainer's memory plan: per-GPU bytes by category, before anything is allocated.

``python -m workers.trainer --plan-memory --model-config CONFIG.json --gpu-memory-gib 139`` prints it, and the
trainer checks it at start on CUDA (:func:`check`), refusing with :class:`InsufficientMemoryError` instead of
running out of memory at step 1.

The plan is arithmetic on the model's shape (a Hugging Face ``config.json`` of a Qwen2/Qwen3-style decoder), the
world size, the per-rank batch and the trainer's :class:`Settings`. It follows one step through its phases —
``load`` (materialising the model), ``backward`` (forward and backward of the GRPO loss), ``optimizer`` (the
update) and ``publish`` (the bf16 cast and delta) — and the peak is the largest phase. What each category holds:

* ``master``: fp32 master weights, 4 B per parameter (sharded: 1/W of them);
* ``gradients``: fp32 gradients; the lean optimizer steps each parameter in backward and frees its gradient, so
  only the largest tensor's exists at once;
* ``optimizer``: AdamW moments, 8 B per parameter in fp32, 4 B in bf16 (``adamw-bf16``);
* ``optimizer_temporaries``: torch AdamW's multi-tensor (``foreach``, its default on CUDA) path allocates about
  one fp32 copy of the parameters; the lean optimizer works in 4 Mi-element chunks;
* ``published``: the bf16 rows last published (2 B per parameter); publishing by a fresh cast beside them
  holds two copies, updating them in place one tensor at a time holds one plus the largest tensor;
* ``reference``: the KL term's frozen bf16 copy;
* ``weight_copies``: bf16 casts of fp32 weights that autocast saves for backward (one rank), or the parameters
  FSDP all-gathers in the compute dtype (two layers in flight, plus the root's embedding and head);
* ``activations``: what autograd saves per token in the decoder (coefficients below, counted on HF's Qwen3
  layers with ``torch.autograd.graph.saved_tensors_hooks``); with activation checkpointing only each layer's
  input is kept, plus one layer recomputed during backward;
* ``logits``: full ``[tokens, vocab]`` logits, their fp32 copy, ``log_softmax`` and its gradients — or, chunked,
  one chunk of completion rows at a time (``workers.rl.grpo``'s chunked logsumexp);
* ``load_transient``: a whole fp32 model on the device before sharding (the old way), or one full tensor at a
  time (meta device → ``fully_shard`` → load shard by shard);
* ``reserve``: CUDA context, library workspaces and allocator slack, a fixed allowance on CUDA.

Attention is assumed to be a fused kernel (SDPA's flash/memory-efficient paths: no ``[L, L]`` scores kept).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aurora_store.errors import ConfigError, InsufficientMemoryError

GIB = 1 << 30
OPTIMIZERS = ("adamw", "adamw-bf16")
COMPUTE = ("float32", "bfloat16")
_LEAN_CHUNK = 1 << 22  # workers.trainer.optim's chunk: its fp32 temporaries are a few chunks
CUDA_RESERVE = 2 * GIB  # CUDA context (~0.5 GiB), cuBLAS/NCCL workspaces, caching-allocator slack

#: Bytes autograd keeps per token and decoder layer, as ``(per hidden, per q width, per kv width, per
#: intermediate)``, and per token outside the layers (per hidden): counted on HF's Qwen3 decoder layer. In fp32
#: every saved tensor is 4 B (6 of width H: norms and residual inputs; 4 each of q, kv and intermediate width:
#: projections, q/k norms, rotary outputs, the expanded kv, SiLU and its product). Under bf16 autocast the
#: residual stream and the RMS norms stay fp32 while projections are saved in bf16.
_SAVED: dict[str, tuple[tuple[int, int, int, int], int]] = {
    "float32": ((24, 16, 16, 16), 8),
    "bfloat16": ((26, 10, 10, 8), 8),
}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2/Qwen3-style decoder that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face ``config.json`` (``head_dim`` defaults to ``hidden_size / num_attention_heads``)."""
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                       kv_heads=int(config.get("num_key_value_heads", heads)),
                       head_dim=int(config.get("head_dim") or hidden // heads),
                       intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                       tied=bool(config.get("tie_word_embeddings", False)))
        except KeyError as exc:
            raise ConfigError(f"model config lacks {exc.args[0]!r}: a Qwen2/Qwen3-style config.json is needed") \
                from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelShape:
        try:
            return cls.from_config(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read model config {path}: {exc}") from None

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_width, self.kv_width
        return 2 * h * q + 2 * h * kv + 3 * h * self.intermediate + 2 * h + 2 * self.head_dim

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Embedding, untied head and final norm: FSDP's root group."""
        return self.embed_params * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def largest_tensor(self) -> int:
        return max(self.embed_params, self.hidden * self.intermediate, self.hidden * self.q_width)


@dataclass(frozen=True)
class Batch:
    """One rank's share of a GRPO step: ``sequences`` padded to ``seq_len`` tokens, of which ``completion_len``
    need a log-probability (default: all)."""

    sequences: int
    seq_len: int
    completion_len: int | None = None

    def __post_init__(self) -> None:
        if self.sequences < 1 or self.seq_len < 1 or (self.completion_len is not None and
                                                      not 0 < self.completion_len <= self.seq_len):
            raise ConfigError(f"batch needs sequences ≥ 1 and 0 < completion_len ≤ seq_len, got {self}")

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len

    @property
    def scored(self) -> int:
        return self.sequences * (self.completion_len or self.seq_len)


@dataclass(frozen=True)
class Settings:
    """What the trainer does that changes its memory. :data:`NEW` is the default on CUDA, :data:`OLD` the
    trainer before it had a memory plan (fp32 everything, torch AdamW, full logits, whole-model load)."""

    optimizer: str = "adamw-bf16"
    foreach: bool = False  # torch AdamW's multi-tensor path (allocates ~one fp32 copy of the parameters)
    compute: str = "bfloat16"  # autocast (one rank) or FSDP's param dtype
    logits_chunk: int = 2048  # completion rows per chunk of the chunked logsumexp; 0: full logits
    activation_checkpointing: bool = True
    sharded_load: bool = True  # meta device → fully_shard → load shard by shard
    published_in_place: bool = True
    grads_freed: bool = True  # gradients freed right after the update (not alive through forward and publish)
    reference: bool = False  # KL term's frozen bf16 copy

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose from {list(OPTIMIZERS)}")
        if self.compute not in COMPUTE:
            raise ConfigError(f"unknown compute dtype {self.compute!r}; choose from {list(COMPUTE)}")
        if self.logits_chunk < 0:
            raise ConfigError(f"logits_chunk must be ≥ 0, got {self.logits_chunk}")


NEW = Settings()
OLD = Settings(optimizer="adamw", foreach=True, compute="float32", logits_chunk=0, activation_checkpointing=False,
               sharded_load=False, published_in_place=False, grads_freed=False)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU by phase and category; ``per_gpu_bytes`` is the largest phase."""

    phases: dict[str, dict[str, int]]
    budget_bytes: int | None
    world_size: int
    settings: Settings
    batch: Batch
    params: int
    notes: tuple[str, ...] = field(default=())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def per_gpu_bytes(self) -> int:
        return sum(self.phases[self.peak_phase].values())

    @property
    def categories(self) -> dict[str, int]:
        return dict(self.phases[self.peak_phase])

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.per_gpu_bytes <= self.budget_bytes

    def why(self) -> str:
        """One sentence: the peak, the budget and what dominates it."""
        top = sorted(self.categories.items(), key=lambda kv: -kv[1])[:4]
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in top if v)
        budget = "no budget" if self.budget_bytes is None else f"{self.budget_bytes / GIB:.1f} GiB available"
        verdict = "fits" if self.fits else "does not fit"
        return (f"{self.per_gpu_bytes / GIB:.1f} GiB per GPU at its peak ({self.peak_phase}: {parts} GiB) "
                f"{verdict}: {budget} ({self.params / 1e9:.2f} B parameters, {self.world_size} rank(s), "
                f"{self.batch.sequences}×{self.batch.seq_len} tokens per rank)")

    def check(self) -> None:
        if not self.fits:
            raise InsufficientMemoryError(f"the trainer will not fit: {self.why()}; " + "; ".join(self.notes))

    def to_json(self) -> dict[str, Any]:
        return {"fits": self.fits, "per_gpu_bytes": self.per_gpu_bytes, "budget_bytes": self.budget_bytes,
                "peak_phase": self.peak_phase, "categories": self.categories, "phases": self.phases,
                "world_size": self.world_size, "params": self.params, "batch": self.batch.__dict__,
                "settings": self.settings.__dict__, "why": self.why(), "notes": list(self.notes)}


def plan(shape: ModelShape, batch: Batch, settings: Settings = NEW, *, world_size: int = 1,
         budget_bytes: int | None = None, device: str = "cuda") -> MemoryPlan:
    """The memory plan of one rank (see the module docstring for what each category holds)."""
    if world_size < 1:
        raise ConfigError(f"world size must be ≥ 1, got {world_size}")
    if settings.optimizer == "adamw-bf16" and world_size > 1:
        raise ConfigError("adamw-bf16 steps parameters during backward: one rank only")
    s, w, p = settings, world_size, shape.params
    b = 2 if s.compute == "bfloat16" else 4
    shard = -(-p // w)
    master = 4 * shard
    lean = s.optimizer == "adamw-bf16"
    optimizer = (4 if lean else 8) * shard
    grads = 4 * shape.largest_tensor if lean else 4 * shard
    layer_tensor = max(shape.hidden * shape.intermediate, shape.hidden * shape.q_width)
    if lean:  # a chunk's fp32 moments (m, v; the gradient is fp32 already) while one parameter steps
        opt_temp = 8 * min(_LEAN_CHUNK, shape.largest_tensor)
        head_temp, layer_temp = 8 * min(_LEAN_CHUNK, shape.embed_params), 8 * min(_LEAN_CHUNK, layer_tensor)
    else:
        opt_temp = 4 * shard if s.foreach else 4 * shape.largest_tensor
        head_temp = layer_temp = 0
    published = 2 * shard
    reference = 2 * shard if s.reference else 0
    reserve = CUDA_RESERVE if device == "cuda" else 0

    # Weights in the compute dtype that exist beside the master during forward/backward.
    if w > 1:  # FSDP2: two layers gathered (one prefetched), the root group for the whole pass, one layer's grads
        weight_copies = b * (2 * shape.layer_params + shape.root_params) + 4 * shape.layer_params
    elif b == 2:  # autocast (cache off): each layer's bf16 weights are saved for its backward
        layers_alive = 1 if s.activation_checkpointing else shape.layers
        weight_copies = 2 * (layers_alive * shape.layer_params + shape.embed_params)
    else:
        weight_copies = 0

    (ch, cq, ckv, ci), outside = _SAVED[s.compute]
    h = shape.hidden
    per_layer = ch * h + cq * shape.q_width + ckv * shape.kv_width + ci * shape.intermediate
    if s.activation_checkpointing:  # each layer's input (the fp32 residual stream); one layer recomputed at a time
        saved, recompute = batch.tokens * (shape.layers * 4 * h + outside * h), batch.tokens * per_layer
    else:
        saved, recompute = batch.tokens * (shape.layers * per_layer + outside * h), 0
    if s.logits_chunk:  # saved: the picked hidden rows and each row's logsumexp; one chunk's logits at a time
        rows = min(s.logits_chunk, batch.scored)
        logits_saved = batch.scored * (b * h + 4)
        logits_transient = rows * shape.vocab * (8 + (2 if b == 2 else 0))
    else:  # every position: log_softmax (saved), then its gradient, the logits' gradient (and its bf16 cast)
        logits_saved = batch.tokens * shape.vocab * 4
        logits_transient = batch.tokens * shape.vocab * (8 + (b if b == 2 else 0))

    if s.sharded_load:
        load_transient = 4 * shape.largest_tensor
        load_reference = reference
    else:  # the whole fp32 model on every device, and the reference deep-copied from it in fp32 there
        load_transient = 4 * p - master
        load_reference = 4 * p if s.reference else 0
    if lean:  # stepped in backward: the head's gradient first, then one layer tensor's at a time
        head_grads, layer_grads = 4 * shape.embed_params, 4 * layer_tensor
    elif s.grads_freed:  # freed after each update: the head's come first in backward, all exist at its end
        head_grads, layer_grads = 4 * shape.embed_params, grads
    else:  # alive from the previous epoch's update
        head_grads = layer_grads = grads
    publish_copies = published + 2 * shape.largest_tensor if s.published_in_place else 2 * published
    common = {"master": master, "optimizer": optimizer, "published": published, "reference": reference,
              "weight_copies": weight_copies}
    # Backward has two peaks: at its start (the loss head's logits and the head's gradient, every activation
    # still saved) and inside the decoder (a recomputed layer, one tensor stepping); the larger one counts.
    phases = {
        "load": {"master": master, "load_transient": load_transient, "reference": load_reference,
                 "reserve": reserve},
        "backward_head": {**common, "gradients": head_grads, "activations": saved,
                          "logits": logits_saved + max(logits_transient, head_temp), "reserve": reserve},
        "backward_layers": {**common, "gradients": layer_grads, "activations": saved + recompute,
                            "logits": logits_saved, "optimizer_temporaries": layer_temp, "reserve": reserve},
        "optimizer": {"master": master, "optimizer": optimizer, "gradients": grads, "optimizer_temporaries": opt_temp,
                      "published": published, "reference": reference, "reserve": reserve},
        "publish": {"master": master, "optimizer": optimizer, "gradients": 0 if s.grads_freed else grads,
                    "published": publish_copies, "reference": reference, "reserve": reserve},
    }
    notes = []
    if not s.activation_checkpointing:
        notes.append("activation checkpointing is off")
    if not s.logits_chunk:
        notes.append("logits are materialised for every token")
    if s.optimizer == "adamw":
        notes.append("AdamW keeps fp32 moments" + (" and foreach temporaries" if s.foreach else ""))
    if not s.published_in_place:
        notes.append("publishing holds two bf16 copies")
    if not s.sharded_load:
        notes.append("the whole fp32 model is loaded on the device before sharding")
    return MemoryPlan(phases, budget_bytes, w, s, batch, p, tuple(notes))


def settings_for(*, device: str, world_size: int, optimizer: str, compute: str, activation_checkpointing: bool,
                 kl: bool, logits_chunk: int) -> Settings:
    """The settings a trainer with these resolved options runs with (what :func:`check` plans)."""
    one_rank_fp32 = world_size == 1 and device != "cuda"  # a single CPU rank computes in fp32
    return replace(NEW, optimizer=optimizer, foreach=optimizer == "adamw" and device == "cuda",
                   compute="float32" if one_rank_fp32 else compute, logits_chunk=logits_chunk,
                   activation_checkpointing=activation_checkpointing, reference=kl)


def model_config(model_dir: str | None, overrides: str | None) -> dict[str, Any]:
    """The HF config the trainer would build: ``--model``'s ``config.json``, or the built-in config with
    ``--model-config`` (a preset name, a file or inline JSON) over it — as
    :class:`~workers.trainer.bootstrap.PolicyModel`."""
    from workers.rl.model import built_in_config

    if model_dir:
        path = Path(model_dir) / "config.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
    return built_in_config(overrides)


def run_cli(argv: list[str] | None = None) -> int:
    """``python -m workers.trainer --plan-memory …``: print the plan (``--json``: one JSON object); exit 0 if it
    fits, 3 if not."""
    from workers.trainer.cli import build_parser, resolve_activation_checkpointing, resolve_optimizer

    a = build_parser().parse_args(argv)
    config = model_config(a.model, a.model_config)
    shape = ModelShape.from_config(config)
    world = a.world_size
    sequences = a.plan_sequences or -(-a.batch_size * a.group_size // world)
    seq_len = min(a.plan_seq_len, int(config.get("max_position_embeddings") or a.plan_seq_len))
    if a.plan_settings == "old":
        settings = replace(OLD, reference=a.kl_coef > 0)
    else:
        optimizer = resolve_optimizer(a.optimizer, "cuda", world)
        settings = settings_for(device="cuda", world_size=world, optimizer=optimizer, compute=a.compute_dtype,
                                activation_checkpointing=resolve_activation_checkpointing(
                                    a.activation_checkpointing, "cuda"),
                                kl=a.kl_coef > 0, logits_chunk=a.logits_chunk)
    budget = int(a.gpu_memory_gib * GIB) if a.gpu_memory_gib else None
    result = plan(shape, Batch(sequences, seq_len), settings, world_size=world, budget_bytes=budget)
    if a.json:
        print(json.dumps(result.to_json()))
    else:
        print(f"fits: {result.fits}")
        print(f"per_gpu_bytes: {result.per_gpu_bytes} ({result.per_gpu_bytes / GIB:.1f} GiB, {result.peak_phase})")
        for name, value in sorted(result.categories.items(), key=lambda kv: -kv[1]):
            print(f"  {name:22s} {value / GIB:8.2f} GiB")
        print(result.why())
        for note in result.notes:
            print(f"note: {note}")
    return 0 if result.fits else 3


def check(config: Mapping[str, Any], *, world_size: int, sequences: int, seq_len: int, settings: Settings,
          budget_bytes: int) -> MemoryPlan:
    """The trainer's start check: the plan for this run, raising :class:`InsufficientMemoryError` if it will
    not fit ``budget_bytes``."""
    seq = min(seq_len, int(config.get("max_position_embeddings") or seq_len))
    result = plan(ModelShape.from_config(config), Batch(sequences, seq), settings, world_size=world_size,
                  budget_bytes=budget_bytes)
    result.check()
    return result
