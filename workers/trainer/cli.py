"""Command line of ``python -m workers.trainer``: the one place the trainer's configuration is read."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aurora_store import metrics
from aurora_store.codec.params import DEFAULT_SEGMENT_BYTES
from aurora_store.config import CommandDefaults, default_run_name
from workers.trainer.rollout_check import DEFAULT_TOLERANCE


@dataclass(frozen=True)
class TrainerConfig:
    bucket: str
    redis: str
    region: str
    run: str
    steps: int
    batch_size: int  # prompts per step (B)
    group_size: int  # samples per prompt (G)
    lr: float
    epochs: int
    clip_eps: float
    kl_coef: float
    snapshot_every: int
    checkpoint_dir: str
    model: str | None  # HF model directory; default: the built-in small Qwen3
    model_config: str | None  # JSON overrides of the built-in config (e.g. a wider model for benchmarks)
    dataset: str | None  # GSM8K-style .jsonl/.parquet; default: the built-in addition task
    warm_start_steps: int
    max_operand: int
    seed: int
    streams: int | None
    segment_bytes: int
    lease_factor: float
    initial_lease_s: float
    signing_key: str | None
    metrics_port: int | None
    logdir: str | None
    wandb: bool
    step_timeout_s: float
    split: str  # "proportional" (to estimated throughput) or "uniform"
    compute_dtype: str = "bfloat16"  # FSDP2 param_dtype under torchrun (≥ 2 ranks); bf16 autocast on one CUDA rank
    verify_published_digest: bool = False  # recompute the published weights' digest from scratch every version
    device: str = "auto"  # "auto" (CUDA when available), "cuda" or "cpu": where model, optimizer and step live
    throughput_ema: float = 0.5  # β: weight of the newest measured settlement in τ_a
    exclusion_decay: float = 0.5  # α: τ_a multiplier when an actor is excluded from a step
    optimizer: str = "auto"  # "adamw" (fp32 moments), "adamw-bf16" (lean) or "auto" (lean on one CUDA rank)
    activation_checkpointing: str = "auto"  # "on", "off" or "auto" (on for CUDA)
    logits_chunk: int = 2048  # completion rows per chunk of the GRPO loss's logsumexp (0: all at once)
    plan_seq_len: int = 2048  # longest prompt + completion the memory check plans for (capped by the model's)
    gpu_memory_gib: float | None = None  # the memory check's budget (default: what CUDA reports)
    checkpoint_every: int | None = None  # write a checkpoint every N steps; None: from its size and the disk
    logprob_tolerance: float = DEFAULT_TOLERANCE  # the logprob check's per-sample bound (0: no check)
    min_actors: int = 1  # the first step of this process waits for this many eligible actors (≤ step_timeout_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workers.trainer",
        description="GRPO trainer: one-step asynchronous; publishes each version as a sparse delta into its "
                    "home bucket (cut-through, multi-stream), announces it on Redis, and hands out per-prompt "
                    "leases to eligible actors. Restarting resumes from --checkpoint-dir.",
        epilog="example: python -m workers.trainer --bucket ./runs/demo/us --redis redis://127.0.0.1:6379/0 "
               "--region us --steps 40   (data parallel over N ranks: torchrun --standalone --nproc-per-node N "
               "-m workers.trainer …; rank 0 talks to Redis, every rank uploads its own shard's delta)")
    p.add_argument("--bucket", help="home bucket URL (the source of every version)")
    p.add_argument("--redis", help="Redis URL of the control plane")
    p.add_argument("--region", default="home", help="the trainer's region (its bucket's region)")
    p.add_argument("--run", "--run-name", dest="run", default=default_run_name(),
                   help="run name; under torchrun spell it --run-name (torchrun takes --run for its --run-path)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run (versions to publish)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per step (B)")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt (G)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--epochs", type=int, default=4, help="optimizer updates per batch of rollouts")
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--kl-coef", type=float, default=0.0,
                   help="β_KL: weight of the k3 KL penalty to a frozen bf16 copy of the initial policy "
                        "(0 = off: no reference copy, the loss is the clipped surrogate alone)")
    p.add_argument("--snapshot-every", type=int, default=10, help="write a full snapshot every K versions")
    p.add_argument("--checkpoint-dir", help="local directory for the trainer's own checkpoint")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="checkpoint (fp32 master + optimizer state, written in the background) every N steps and "
                        "after the last one; default: ceil(checkpoint bytes / 1 GiB) in [1, 50], doubled where the "
                        "disk holds one checkpoint but not two. A restart resumes from the newest one and "
                        "publishes on top of the bucket's latest version")
    p.add_argument("--model", help="HF model directory (default: built-in small Qwen3 + warm start)")
    p.add_argument("--model-config", help="a preset (qwen3, qwen3_moe: the same model with 8 experts, 2 active) "
                   "or a JSON file (or inline JSON) overriding fields of the built-in Qwen3 config, e.g. "
                   "'{\"hidden_size\": 512, \"num_hidden_layers\": 4}' ('\"preset\": \"qwen3_moe\"' starts "
                   "from a preset)")
    p.add_argument("--dataset", help="GSM8K-style .jsonl/.parquet (question/answer); default: addition task")
    p.add_argument("--warm-start-steps", type=int, default=120, help="supervised steps before RL (built-in task)")
    p.add_argument("--max-operand", type=int, default=9, help="addition task: operands in [0, N]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streams", type=int, help="parallel upload streams (default AURORA_STREAMS or 4)")
    p.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES)
    p.add_argument("--lease-factor", type=float, default=2.5, help="lease expiry = factor × median completion")
    p.add_argument("--initial-lease-s", type=float, default=60.0, help="lease expiry before anything is measured")
    p.add_argument("--signing-key", default=CommandDefaults.from_env().signing_key,
                   help="Ed25519 private key (file or base64) used to sign manifests")
    p.add_argument("--metrics-port", type=metrics.port_number, help=metrics.PORT_HELP)
    p.add_argument("--logdir", help="TensorBoard event files go here (default: <checkpoint-dir>/tb)")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (WANDB_MODE=offline works)")
    p.add_argument("--step-timeout-s", type=float, default=600.0, help="give up if a step gets no progress")
    p.add_argument("--min-actors", type=int, default=1, metavar="N",
                   help="the first step (of this process: also after a restart) waits until N actors are eligible, "
                        "at most --step-timeout-s, then goes ahead with those there; later steps never wait for "
                        "more than one")
    p.add_argument("--split", choices=["proportional", "uniform"], default="proportional",
                   help="how a batch is split across eligible actors (uniform: for comparison)")
    p.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="under torchrun (≥ 2 ranks, FSDP2): dtype parameters are gathered in for forward/backward "
                        "(gradients are reduced in fp32, master weights stay fp32); one CUDA rank runs the step "
                        "under autocast in it (and TF32 for what stays fp32); one CPU rank computes in fp32")
    p.add_argument("--verify-published-digest", action="store_true",
                   help="after every publish, hash the published bf16 weights from scratch (each rank its own "
                        "rows) and check the sum equals the manifest's weights_digest")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where the model, optimizer state, GRPO step and delta extraction run (auto: CUDA when "
                        "available; under torchrun each process takes cuda:LOCAL_RANK, FSDP2 over NCCL)")
    p.add_argument("--throughput-ema", type=float, default=0.5, metavar="β",
                   help="after each settlement τ_a ← (1−β)·τ_a + β·measured tokens/s (β in (0, 1]; 1 = newest "
                        "measurement only). Measured by the trainer: tokens of accepted results over the time the "
                        "actor held its leases")
    p.add_argument("--exclusion-decay", type=float, default=0.5, metavar="α",
                   help="τ_a ← α·τ_a when an actor is excluded from a step (α in (0, 1]); the decayed estimate "
                        "stays until measured settlements raise it")
    p.add_argument("--optimizer", choices=["auto", "adamw", "adamw-bf16"], default="auto",
                   help="adamw: fp32 moments, global gradient clipping. adamw-bf16 (one rank): bf16 moments, each "
                        "parameter stepped during backward and its gradient freed (no fp32 gradient set, no global "
                        "clipping) — what fits a real-size model (e.g. Qwen3-8B on one GPU). auto: adamw-bf16 on "
                        "one CUDA rank, adamw otherwise")
    p.add_argument("--activation-checkpointing", choices=["auto", "on", "off"], default="auto",
                   help="recompute each decoder layer in backward instead of keeping its activations (auto: on CUDA)")
    p.add_argument("--logits-chunk", type=int, default=2048, metavar="ROWS",
                   help="the GRPO loss computes logits and logsumexp for this many completion tokens at a time, "
                        "never for the whole batch (0: all at once)")
    p.add_argument("--logprob-tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="NATS",
                   help="reject a result whose claimed per-token logprobs differ from the trainer's recomputation "
                        "on the leased version's bf16 weights by more than this, averaged over a sample "
                        "(0: no check; one rank only)")
    m = p.add_argument_group(
        "memory plan", "python -m workers.trainer --plan-memory --model-config CONFIG.json --gpu-memory-gib 139 "
                       "[--world-size N] [--json]: per-GPU bytes by category (master, gradients, optimizer, "
                       "published, activations, logits, …) and whether they fit; needs no bucket or Redis. The "
                       "trainer runs the same check at start on CUDA and refuses to start if it will not fit.")
    m.add_argument("--plan-memory", action="store_true", help="print the memory plan and exit")
    m.add_argument("--gpu-memory-gib", type=float,
                   help="memory per GPU to plan against (default at start: what CUDA reports)")
    m.add_argument("--world-size", type=int, default=1, help="--plan-memory: ranks (one GPU each)")
    m.add_argument("--plan-sequences", type=int,
                   help="--plan-memory: sequences per rank (default: batch-size × group-size / world-size)")
    m.add_argument("--plan-seq-len", type=int, default=2048,
                   help="longest prompt + completion in tokens to plan for (capped by the model's "
                        "max_position_embeddings)")
    m.add_argument("--plan-settings", choices=["current", "old"], default="current",
                   help="--plan-memory: the trainer's settings (from these flags, on CUDA), or the settings before "
                        "the memory plan (fp32 compute, AdamW + foreach, full logits, whole-model load)")
    m.add_argument("--json", action="store_true", help="--plan-memory: print the plan as JSON")
    return p


def resolve_optimizer(choice: str, device_type: str, world_size: int) -> str:
    """``auto``: the lean optimizer on one CUDA rank (what fits a real model on one GPU), AdamW otherwise
    (sharded ranks hold 1/W of fp32 moments; the CPU keeps the exact AdamW the tests compare against)."""
    if choice != "auto":
        return choice
    return "adamw-bf16" if device_type == "cuda" and world_size == 1 else "adamw"


def resolve_activation_checkpointing(choice: str, device_type: str) -> bool:
    return choice == "on" or (choice == "auto" and device_type == "cuda")


def parse_args(argv: list[str] | None = None) -> TrainerConfig:
    p = build_parser()
    a = p.parse_args(argv)
    for flag, value in (("--throughput-ema", a.throughput_ema), ("--exclusion-decay", a.exclusion_decay)):
        if not 0 < value <= 1:
            p.error(f"{flag} must be in (0, 1], got {value}")
    if a.checkpoint_every is not None and a.checkpoint_every < 1:
        p.error(f"--checkpoint-every must be at least 1, got {a.checkpoint_every}")
    if a.kl_coef < 0:
        p.error(f"--kl-coef must be non-negative, got {a.kl_coef}")
    if not 0 <= a.logprob_tolerance < float("inf"):
        p.error(f"--logprob-tolerance must be ≥ 0 and finite, got {a.logprob_tolerance}")
    if a.min_actors < 1:
        p.error(f"--min-actors must be at least 1, got {a.min_actors}")
    if a.logits_chunk < 0:
        p.error(f"--logits-chunk must be ≥ 0, got {a.logits_chunk}")
    missing = [f for f, v in (("--bucket", a.bucket), ("--redis", a.redis), ("--checkpoint-dir", a.checkpoint_dir))
               if not v]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    return TrainerConfig(
        bucket=a.bucket, redis=a.redis, region=a.region, run=a.run, steps=a.steps, batch_size=a.batch_size,
        group_size=a.group_size, lr=a.lr, epochs=a.epochs, clip_eps=a.clip_eps, kl_coef=a.kl_coef,
        snapshot_every=a.snapshot_every, checkpoint_dir=a.checkpoint_dir, model=a.model,
        model_config=a.model_config, dataset=a.dataset,
        warm_start_steps=a.warm_start_steps, max_operand=a.max_operand, seed=a.seed, streams=a.streams,
        segment_bytes=a.segment_bytes, lease_factor=a.lease_factor, initial_lease_s=a.initial_lease_s,
        signing_key=a.signing_key, metrics_port=a.metrics_port, logdir=a.logdir, wandb=a.wandb,
        step_timeout_s=a.step_timeout_s, split=a.split, compute_dtype=a.compute_dtype,
        verify_published_digest=a.verify_published_digest, throughput_ema=a.throughput_ema,
        exclusion_decay=a.exclusion_decay, device=a.device, optimizer=a.optimizer,
        activation_checkpointing=a.activation_checkpointing, logits_chunk=a.logits_chunk, plan_seq_len=a.plan_seq_len,
        gpu_memory_gib=a.gpu_memory_gib, checkpoint_every=a.checkpoint_every,
        logprob_tolerance=a.logprob_tolerance, min_actors=a.min_actors)
