"""Per-architecture facts and the one rule engine that turns a model config into the engine's tensors.

Decoder families differ in a handful of facts — which projections the engine fuses, which biases and norms
exist, how routed experts are named and stacked — not in code, so each family is one row of :data:`FAMILIES`
(as vLLM's ``packed_modules_mapping`` and expert-parameter mappings describe the same facts on its side) and
:func:`decoder_specs` applies the same rules to every row. What each rule produces is proven element for
element against vLLM's own loaders (``tests/vllm/test_layout_coverage.py``).

Two trainer-side name sets exist for MoE models: transformers 5 holds the routed experts *in memory* as one
3-D tensor per projection (``mlp.experts.gate_up_proj`` ``[E, 2·I, H]``, gate rows then up rows per expert,
``mlp.experts.down_proj`` ``[E, H, I]``), exactly vLLM's ``w13_weight`` / ``w2_weight``; a *saved
checkpoint* holds one 2-D tensor per expert and projection (``experts.N.gate_proj.weight``, Mixtral's
``experts.N.w1.weight``), which stack into the same engine tensor row block by row block. Dense families
have one name set.

Some families store their experts in an order of their own: gpt-oss holds each expert *transposed*
(``gate_up_proj`` ``[E, H, 2·I]``, ``down_proj`` ``[E, I, H]``, in memory and in checkpoints alike), with gate and
up columns alternating — which vLLM keeps (its ``swigluoai`` activation reads ``x[..., ::2]`` and ``x[..., 1::2]``),
so only the transpose is a fact, not a de-interleave. Such a component carries an
:class:`~aurora_store.codec.order.ElementOrder`; the engine's names differ from the trainer's too
(``self_attn`` → ``attn``, ``embed_tokens`` → ``embedding``: :attr:`Family.renames`).

DeepSeek-V3 (whose architecture Kimi-K2 and DeepSeek-V2 share; only deepseek_v3 is proven) uses multi-head
latent attention (:class:`Mla`): low-rank q and kv projections, which vLLM fuses as ``fused_qkv_a_proj`` =
``q_a_proj`` rows then ``kv_a_proj_with_mqa`` rows when ``q_lora_rank`` is set. vLLM *derives* tensors from
``kv_b_proj`` after loading (the absorbed ``W_UK_T`` and ``W_UV`` its decode path multiplies by); they are
engine parameters no trainer tensor makes, so the layout declares them as :class:`EngineOnly` with the rule
that recomputes them after a write (``workers.vllm.derived``), as it declares the router's
``e_score_correction_bias``, a float32 buffer the trainer never trains (a constant, loaded once).

This module knows nothing of tensors: it returns :class:`TensorSpec` values that
:class:`~aurora_store.codec.layout.ModelLayout` turns into its inference tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aurora_store.codec.order import ElementOrder
from aurora_store.errors import LayoutError, UnsupportedModelError

NameSet = Literal["memory", "checkpoint"]
NAME_SETS: tuple[NameSet, ...] = ("memory", "checkpoint")
#: When a bias or norm exists: never, always, or when the named boolean config field is true.
Presence = Literal["never", "always", "attention_bias", "mlp_bias"]


@dataclass(frozen=True)
class TensorSpec:
    """One engine tensor: ``components`` ``(train name, rows)`` stack along the first ``stack_dims`` dims
    taken as one row axis (1 for ordinary tensors; 2 when per-expert 2-D tensors stack into ``[E, R, C]``)."""

    name: str
    shape: tuple[int, ...]
    components: tuple[tuple[str, int], ...]
    stack_dims: int = 1
    #: The element order of the one component, when it is not storage order (transposed experts).
    order: ElementOrder | None = None

    def __post_init__(self) -> None:
        if self.order is not None and len(self.components) != 1:
            raise LayoutError(f"{self.name}: an element order applies to a tensor of one component")


@dataclass(frozen=True)
class Experts:
    """How a family's routed experts are named (vLLM's ``FusedMoE`` stacks them into ``w13``/``w2``)."""

    #: The decoder layer's MoE module, as vLLM and the saved checkpoint name it.
    block: str
    #: Config fields: number of routed experts, each expert's intermediate size.
    count_key: str
    inter_key: str
    #: Which layers are sparse: "all", "step" (Qwen-MoE's ``decoder_sparse_step`` and ``mlp_only_layers``), or
    #: "first_k_dense" (DeepSeek's ``first_k_dense_replace`` dense layers, then every ``moe_layer_freq``-th).
    sparse_layers: Literal["all", "step", "first_k_dense"] = "all"
    #: The router's module name under ``block`` (vLLM's and the trainer's alike), and whether it has a bias.
    router: str = "gate"
    router_bias: bool = False
    #: Per-expert biases (``gate_up_proj_bias`` ``[E, 2·I]``, ``down_proj_bias`` ``[E, H]``; vLLM's ``w13_bias``,
    #: ``w2_bias``).
    bias: bool = False
    #: How the trainer's 3-D expert tensors are ordered: as vLLM's (``[E, 2·I, H]``, ``[E, H, I]``), or each
    #: expert transposed (``[E, H, 2·I]``, ``[E, I, H]``: gpt-oss).
    stored: Literal["engine", "transposed"] = "engine"
    #: The trainer alternates gate and up (columns when transposed, else rows) where the engine wants all gate
    #: rows then all up rows. (gpt-oss alternates, and so does vLLM's gpt-oss: False.)
    deinterleave: bool = False
    #: Checkpoint names of each expert's gate, up and down projections (vLLM's expert-parameter mapping);
    #: ``None``: saved checkpoints hold the same 3-D tensors as memory.
    checkpoint_names: tuple[str, str, str] | None = None
    #: Config field counting always-on shared experts, which vLLM runs as one dense MLP under ``block``
    #: (``shared_experts.gate_up_proj`` of ``count × inter`` rows each for gate and up); ``None``: none.
    shared_key: str | None = None
    #: The router's score-correction bias (``gate.e_score_correction_bias``) exists when the config's
    #: ``topk_method`` is this value; the trainer holds it as a buffer it never trains (an engine-only constant).
    correction_bias_when: str | None = None
    #: The name set of a snapshot's weight files: ``"memory"`` (the trainer's 3-D expert tensors, which vLLM's
    #: loader of the family takes as they are) or ``"checkpoint"`` (per-expert tensors, as ``save_pretrained``
    #: writes them: vLLM's DeepSeek loader knows no other expert names).
    snapshot_names: NameSet = "memory"

    def __post_init__(self) -> None:
        if self.checkpoint_names is not None and (self.stored != "engine" or self.deinterleave or self.bias):
            # Per-expert 2-D tensors stack in storage order; a family that needs more has to say how.
            raise LayoutError("per-expert checkpoint names go with experts stored in vLLM's order, without biases")
        if self.snapshot_names == "checkpoint" and self.checkpoint_names is None:
            raise LayoutError("snapshots in checkpoint names need the family's per-expert checkpoint names")


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3): which tensors vLLM derives from ``kv_b_proj`` after loading,
    under the attention module (``self_attn.``), and the name of the rule that recomputes them."""

    #: vLLM's absorbed ``W_UK`` (as ``[heads, nope, kv_lora_rank]``) and ``W_UV`` (``[heads, kv_lora_rank, v]``).
    derived: tuple[str, ...] = ("mla_attn.mla_attn.W_UK_T", "mla_attn.mla_attn.W_UV")
    #: The refresh rule (a registry entry engines implement: ``workers.vllm.derived.REFRESHERS``).
    refresh: str = "mla_absorb"
    #: vLLM's ``fused_qkv_a_proj`` holds ``q_a_proj`` rows, then ``kv_a_proj_with_mqa`` rows (its shard ids 0, 1).
    q_a_first: bool = True


@dataclass(frozen=True)
class EngineOnly:
    """An engine parameter the layout does not ship: ``rule`` ``"constant"`` (loaded once, never trained:
    ``source`` is ``None``) or the name of the rule that recomputes it from the layout tensor ``source``."""

    name: str
    rule: str
    source: str | None = None


CONSTANT = "constant"


@dataclass(frozen=True)
class Family:
    """The facts that distinguish one decoder family's tensors (see the module docs)."""

    #: "split": the trainer holds q/k/v (gate/up) separately and the engine stacks them into
    #: ``qkv_proj`` (``gate_up_proj``); "fused": the trainer already holds the fused tensor (Phi-3).
    qkv: Literal["split", "fused"] = "split"
    mlp: Literal["split", "fused"] = "split"
    qkv_bias: Presence = "never"
    o_bias: Presence = "never"
    mlp_bias: Presence = "never"
    #: Per-head q/k RMSNorm (``[head_dim]``: Qwen3, Gemma 3) or over the whole projection (OLMo 2/3).
    qk_norm: Literal["none", "head", "projection"] = "none"
    #: Each decoder layer's norms, in the engine's order.
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    #: ``tie_word_embeddings`` when the config does not say (transformers' default for the family).
    tied_default: bool = False
    experts: Experts | None = None
    #: A learned logit per attention head that takes part in the softmax (``self_attn.sinks`` ``[heads]``).
    sinks: bool = False
    #: Engine name = trainer name with each ``(old, new)`` substring replaced (vLLM's ``hf_to_vllm_mapper``).
    renames: tuple[tuple[str, str], ...] = ()
    #: Multi-head latent attention instead of q/k/v projections (``None``: ordinary attention).
    mla: Mla | None = None

    def engine_name(self, train_name: str) -> str:
        for old, new in self.renames:
            train_name = train_name.replace(old, new)
        return train_name


_SANDWICH = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm")

_DEEPSEEK = Family(mla=Mla(), experts=Experts("mlp", "n_routed_experts", "moe_intermediate_size",
                                             sparse_layers="first_k_dense",
                                             checkpoint_names=("gate_proj", "up_proj", "down_proj"),
                                             shared_key="n_shared_experts", correction_bias_when="noaux_tc",
                                             snapshot_names="checkpoint"))

#: model_type → facts. Gemma 3's norms hold ``w`` of ``(1 + w)·x̂`` and its embedding is scaled at run time,
#: in both engines alike, so the stored tensors are shipped unchanged.
FAMILIES: dict[str, Family] = {
    "llama": Family(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias"),
    "mistral": Family(),
    "qwen2": Family(qkv_bias="always"),
    "qwen3": Family(qkv_bias="attention_bias", qk_norm="head"),
    "gemma3_text": Family(qk_norm="head", layer_norms=_SANDWICH, tied_default=True),
    "phi3": Family(qkv="fused", mlp="fused"),
    "olmo2": Family(qk_norm="projection", layer_norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    "olmo3": Family(qk_norm="projection", layer_norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    "qwen3_moe": Family(qkv_bias="attention_bias", qk_norm="head",
                        experts=Experts("mlp", "num_experts", "moe_intermediate_size", sparse_layers="step",
                                        checkpoint_names=("gate_proj", "up_proj", "down_proj"))),
    "mixtral": Family(experts=Experts("block_sparse_moe", "num_local_experts", "intermediate_size",
                                      checkpoint_names=("w1", "w3", "w2"))),
    "gpt_oss": Family(qkv_bias="attention_bias", o_bias="attention_bias", sinks=True,
                      renames=(("model.embed_tokens.", "model.embedding."), (".self_attn.", ".attn.")),
                      experts=Experts("mlp", "num_local_experts", "intermediate_size", router="router",
                                      router_bias=True, bias=True, stored="transposed")),
    # Dense first_k_dense_replace layers, then routed experts + shared experts + a score-corrected router.
    "deepseek_v3": _DEEPSEEK,
}
#: Aliases transformers uses for the same family.
MODEL_TYPE_ALIASES = {"gemma3": "gemma3_text"}

#: Families Aurora knows and refuses, with the reason (a clear error at step 0 beats a silent gap later).
REFUSED: dict[str, str] = {
    "deepseek_v2": "multi-head latent attention like deepseek_v3, but its layout is not proven against vLLM "
                   "(greedy top-k routers, q_proj when q_lora_rank is null): use deepseek_v3's facts only once proven",
    "kimi_k2": "DeepSeek-V3 architecture under a model_type transformers does not know (remote code): not proven "
               "against vLLM",
}


def family_of(config: Mapping[str, Any]) -> tuple[str, Family]:
    """The family of a HF ``config.json``; :class:`~aurora_store.errors.UnsupportedModelError` otherwise."""
    raw = str(config.get("model_type", "")).lower()
    model_type = MODEL_TYPE_ALIASES.get(raw, raw)
    if model_type in REFUSED:
        raise UnsupportedModelError(f"model_type {raw!r} has no Aurora layout: {REFUSED[model_type]}")
    family = FAMILIES.get(model_type)
    if family is None:
        raise UnsupportedModelError(f"unsupported model_type {raw!r}; supported: {sorted(FAMILIES)}")
    return model_type, family


def snapshot_names(config: Mapping[str, Any], family: Family | None = None) -> NameSet:
    """The name set a snapshot of this model's weights is written in, so that the engine loads it as it is."""
    if family is None:
        _, family = family_of(config)
    return family.experts.snapshot_names if family.experts is not None else "memory"


def _present(rule: Presence, config: Mapping[str, Any]) -> bool:
    if rule in ("never", "always"):
        return rule == "always"
    return bool(config.get(rule, False))


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise LayoutError(f"model config lacks a required field: {key!r}")
        return default
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"model config field {key!r} is not an integer: {value!r}") from exc


def _sparse(experts: Experts, config: Mapping[str, Any], layer: int) -> bool:
    if experts.sparse_layers == "all":
        return True
    if experts.sparse_layers == "first_k_dense":
        freq = _int(config, "moe_layer_freq", 1)
        return layer >= _int(config, "first_k_dense_replace", 0) and freq > 0 and layer % freq == 0
    step = _int(config, "decoder_sparse_step", 1)
    only_mlp = set(config.get("mlp_only_layers") or ())
    return layer not in only_mlp and step > 0 and (layer + 1) % step == 0


def decoder_specs(config: Mapping[str, Any], names: NameSet = "memory",
                  family: Family | None = None) -> tuple[list[TensorSpec], tuple[tuple[str, str], ...]]:
    """``(engine tensors, tied aliases)`` of a decoder from its HF config, with trainer names of ``names``.
    ``family`` overrides the config's family (to test what a missing fact does)."""
    if names not in NAME_SETS:
        raise LayoutError(f"unknown name set {names!r}; one of {NAME_SETS}")
    if family is None:
        _, family = family_of(config)
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", hidden // heads if heads else 0)
    layers = _int(config, "num_hidden_layers")
    vocab = _int(config, "vocab_size")
    tied_value = config.get("tie_word_embeddings")
    tied = family.tied_default if tied_value is None else bool(tied_value)
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim

    def single(name: str, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(family.engine_name(name), shape, ((name, shape[0]),))

    def stacked(name: str, parts: list[tuple[str, int]], tail: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(family.engine_name(name), (sum(rows for _, rows in parts), *tail), tuple(parts))

    def kinds(bias: bool) -> tuple[str, ...]:
        return ("weight", "bias") if bias else ("weight",)

    specs = [single("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if family.mla is not None:
            specs += _mla_specs(family.mla, config, a, hidden, heads)
        for kind in kinds(_present(family.qkv_bias, config)) if family.mla is None else ():
            tail = (hidden,) if kind == "weight" else ()
            if family.qkv == "fused":
                specs.append(single(f"{a}qkv_proj.{kind}", (q_rows + 2 * kv_rows, *tail)))
            else:
                specs.append(stacked(f"{a}qkv_proj.{kind}", [(f"{a}q_proj.{kind}", q_rows),
                                                             (f"{a}k_proj.{kind}", kv_rows),
                                                             (f"{a}v_proj.{kind}", kv_rows)], tail))
        if family.mla is None:
            specs.append(single(f"{a}o_proj.weight", (hidden, q_rows)))
        if _present(family.o_bias, config):
            specs.append(single(f"{a}o_proj.bias", (hidden,)))
        if family.sinks:
            specs.append(single(f"{a}sinks", (heads,)))
        if family.qk_norm == "head":
            specs += [single(f"{a}q_norm.weight", (head_dim,)), single(f"{a}k_norm.weight", (head_dim,))]
        elif family.qk_norm == "projection":
            specs += [single(f"{a}q_norm.weight", (q_rows,)), single(f"{a}k_norm.weight", (kv_rows,))]
        experts = family.experts
        if experts is not None and _sparse(experts, config, i):
            specs += _expert_specs(experts, config, p, hidden, names)
        else:
            specs += _dense_mlp_specs(family, config, p + "mlp.", hidden, kinds)
        specs += [single(p + f"{norm}.weight", (hidden,)) for norm in family.layer_norms]
    specs.append(single("model.norm.weight", (hidden,)))
    if tied:
        return specs, (("lm_head.weight", "model.embed_tokens.weight"),)
    specs.append(single("lm_head.weight", (vocab, hidden)))
    return specs, ()


def _mla_specs(mla: Mla, config: Mapping[str, Any], a: str, hidden: int, heads: int) -> list[TensorSpec]:
    """Multi-head latent attention's tensors (vLLM's names; the trainer's are the same but for the fusion)."""
    q_rank = config.get("q_lora_rank")
    kv_rank = _int(config, "kv_lora_rank")
    nope, rope, v = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim"), _int(config, "v_head_dim")
    q_rows, kv_a_rows = heads * (nope + rope), kv_rank + rope

    def one(name: str, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(a + name, shape, ((a + name, shape[0]),))

    if q_rank is None:
        specs = [one("q_proj.weight", (q_rows, hidden)), one("kv_a_proj_with_mqa.weight", (kv_a_rows, hidden))]
    else:
        rank = _int(config, "q_lora_rank")
        parts = ((a + "q_a_proj.weight", rank), (a + "kv_a_proj_with_mqa.weight", kv_a_rows))
        specs = [TensorSpec(a + "fused_qkv_a_proj.weight", (rank + kv_a_rows, hidden),
                            parts if mla.q_a_first else parts[::-1]),
                 one("q_a_layernorm.weight", (rank,)), one("q_b_proj.weight", (q_rows, rank))]
    return [*specs, one("kv_a_layernorm.weight", (kv_rank,)), one("kv_b_proj.weight", (heads * (nope + v), kv_rank)),
            one("o_proj.weight", (hidden, heads * v))]


def engine_only(config: Mapping[str, Any], family: Family | None = None) -> tuple[EngineOnly, ...]:
    """The engine parameters of a decoder that no trainer tensor makes (see :class:`EngineOnly`), in order."""
    if family is None:
        _, family = family_of(config)
    found: list[EngineOnly] = []
    experts = family.experts
    for i in range(_int(config, "num_hidden_layers")):
        p = f"model.layers.{i}."
        if family.mla is not None:
            source = p + "self_attn.kv_b_proj.weight"
            found += [EngineOnly(p + "self_attn." + d, family.mla.refresh, source) for d in family.mla.derived]
        if (experts is not None and experts.correction_bias_when is not None and _sparse(experts, config, i)
                and config.get("topk_method") == experts.correction_bias_when):
            found.append(EngineOnly(p + f"{experts.block}.{experts.router}.e_score_correction_bias", CONSTANT))
    return tuple(found)


def _dense_mlp_specs(family: Family, config: Mapping[str, Any], m: str, hidden: int, kinds) -> list[TensorSpec]:
    inter = _int(config, "intermediate_size")
    bias = _present(family.mlp_bias, config)
    specs = []
    for kind in kinds(bias):
        tail = (hidden,) if kind == "weight" else ()
        name = f"{m}gate_up_proj.{kind}"
        if family.mlp == "fused":
            specs.append(TensorSpec(family.engine_name(name), (2 * inter, *tail), ((name, 2 * inter),)))
        else:
            specs.append(TensorSpec(family.engine_name(name), (2 * inter, *tail),
                                    ((f"{m}gate_proj.{kind}", inter), (f"{m}up_proj.{kind}", inter))))
    down = f"{m}down_proj."
    specs.append(TensorSpec(family.engine_name(down + "weight"), (hidden, inter), ((down + "weight", hidden),)))
    if bias:
        specs.append(TensorSpec(family.engine_name(down + "bias"), (hidden,), ((down + "bias", hidden),)))
    return specs


def _expert_specs(experts: Experts, config: Mapping[str, Any], p: str, hidden: int,
                  names: NameSet) -> list[TensorSpec]:
    count = _int(config, experts.count_key)
    inter = _int(config, experts.inter_key)
    block = p + experts.block + "."
    engine = block + "experts.routed_experts."
    w13, w2 = (count, 2 * inter, hidden), (count, hidden, inter)
    per_expert = names == "checkpoint" and experts.checkpoint_names is not None
    router_at = p + (experts.block if per_expert else "mlp") + f".{experts.router}."
    specs = [TensorSpec(block + f"{experts.router}.weight", (count, hidden), ((router_at + "weight", count),))]
    if experts.router_bias:
        specs.append(TensorSpec(block + f"{experts.router}.bias", (count,), ((router_at + "bias", count),)))
    if experts.shared_key is not None and config.get(experts.shared_key):
        shared = _int(config, experts.shared_key) * inter
        at = block + "shared_experts."
        specs += [TensorSpec(at + "gate_up_proj.weight", (2 * shared, hidden),
                             ((at + "gate_proj.weight", shared), (at + "up_proj.weight", shared))),
                  TensorSpec(at + "down_proj.weight", (hidden, shared), ((at + "down_proj.weight", hidden),))]
    if not per_expert:
        # transformers 5 holds each projection of all experts as one tensor, in vLLM's own order or its own.
        mem = p + "mlp.experts."
        order13, order2, order13_bias = _expert_orders(experts, count, inter, hidden)
        specs.append(TensorSpec(engine + "w13_weight", w13, ((mem + "gate_up_proj", count),), order=order13))
        if experts.bias:
            specs.append(TensorSpec(engine + "w13_bias", (count, 2 * inter), ((mem + "gate_up_proj_bias", count),),
                                    order=order13_bias))
        specs.append(TensorSpec(engine + "w2_weight", w2, ((mem + "down_proj", count),), order=order2))
        if experts.bias:
            specs.append(TensorSpec(engine + "w2_bias", (count, hidden), ((mem + "down_proj_bias", count),)))
        return specs
    assert experts.checkpoint_names is not None
    gate, up, down = experts.checkpoint_names
    ckpt = block + "experts."
    # Per expert, gate rows then up rows (vLLM's shard ids w1, w3); stacked over experts × rows.
    w13_parts = tuple(part for e in range(count)
                      for part in ((f"{ckpt}{e}.{gate}.weight", inter), (f"{ckpt}{e}.{up}.weight", inter)))
    w2_parts = tuple((f"{ckpt}{e}.{down}.weight", hidden) for e in range(count))
    return [*specs, TensorSpec(engine + "w13_weight", w13, w13_parts, stack_dims=2),
            TensorSpec(engine + "w2_weight", w2, w2_parts, stack_dims=2)]


def _expert_orders(experts: Experts, count: int, inter: int, hidden: int
                   ) -> tuple[ElementOrder | None, ElementOrder | None, ElementOrder | None]:
    """Element orders of the trainer's ``gate_up_proj``, ``down_proj`` and ``gate_up_proj_bias`` in vLLM's
    ``w13_weight`` ``[E, 2·I, H]``, ``w2_weight`` ``[E, H, I]`` and ``w13_bias`` ``[E, 2·I]`` (``None``: storage
    order). Gate and up keep the trainer's arrangement unless ``deinterleave`` says the engine splits them."""
    gate_up: ElementOrder | None = None
    down: ElementOrder | None = None
    bias: ElementOrder | None = None
    if experts.stored == "transposed":
        shape = (count, hidden, 2 * inter)
        # [E, H, 2I] → [E, 2I, H]; with alternating columns split as (I, 2), the pair index becomes the block.
        gate_up = (ElementOrder(shape, (count, hidden, inter, 2), (0, 3, 2, 1)) if experts.deinterleave
                   else ElementOrder(shape, shape, (0, 2, 1)))
        down = ElementOrder((count, inter, hidden), (count, inter, hidden), (0, 2, 1))
    elif experts.deinterleave:
        gate_up = ElementOrder((count, 2 * inter, hidden), (count, inter, 2, hidden), (0, 2, 1, 3))
    if experts.deinterleave:
        bias = ElementOrder((count, 2 * inter), (count, inter, 2), (0, 2, 1))
    return gate_up, down, bias
