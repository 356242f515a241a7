"""Command line of ``python -m workers.actor``: the one place an actor's configuration is read."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from aurora_store import metrics
from aurora_store.config import CommandDefaults, default_run_name
from workers.engines import EngineOptions, registered_engines


@dataclass(frozen=True)
class ActorConfig:
    bucket: str  # the regional bucket this actor reads (relay-fed), or the source bucket
    redis: str
    region: str
    run: str
    engine: str  # a registered engine name (workers.engines): "torch", "vllm", or one registered/installed
    actor_id: str | None
    source_bucket: str | None  # fallback when the region's relay is gone or its copy is bad; none if unset
    streams: int | None
    cache_dir: str | None
    metrics_port: int | None
    trainer_public_key: str | None  # path or base64 of the trainer's Ed25519 public key
    batch_size: int  # prompts generated together (a batch boundary is where deltas activate)
    max_new_tokens: int | None
    seed: int
    verify_full_digest: bool  # re-hash all weights after every activation (tests)
    full_sync: bool = False  # baseline: stage every version from its full snapshot instead of its delta
    engine_options: EngineOptions = field(default_factory=EngineOptions)  # --device, vLLM flags
    prefetch: bool = True  # fetch announced segments of newer versions before their manifest exists
    prefetch_bytes: int = 512 << 20  # held + in flight at most; beyond, staging fetches
    cache_token: str | None = None  # the run's bearer secret for the relay's segment cache; None: bucket only
    cache_timeout_s: float = 5.0  # a cache read slower than this falls through to the bucket
    # Spot actors are often up before the trainer has warmed up and written its first snapshot: wait that long
    # (logging while waiting) before giving up; 0 waits for ever.
    wait_for_run_s: float = 1800.0


def default_engine() -> str:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "torch"
    return "vllm"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.actor",
        description="A rollout actor: bootstraps from the newest snapshot in its bucket, replays deltas, takes "
                    "per-prompt leases, generates, and activates new versions at batch boundaries. SIGTERM "
                    "(spot preemption notice) leaves gracefully: leases are handed back, the actor deregisters.",
        epilog="example: python -m workers.actor --bucket s3://aurora-eu/run1 --redis rediss://:pw@host:6379/0 "
               "--region eu-west-1")
    parser.add_argument("--bucket", required=True, help="bucket URL to read versions from (the region's bucket)")
    parser.add_argument("--redis", required=True, help="Redis URL of the control plane (redis:// or rediss://)")
    parser.add_argument("--region", required=True, help="region name (selects the relay's event stream)")
    parser.add_argument("--run", default=default_run_name(), help="run name (default: AURORA_RUN or 'default')")
    parser.add_argument("--engine", choices=registered_engines(), default=None,
                        help="inference engine, from workers.engines' registry (default: vllm when installed, "
                             "else torch)")
    parser.add_argument("--id", dest="actor_id", help="actor id (default: <region>-<host>-<pid>)")
    parser.add_argument("--source-bucket",
                        help="the trainer's (source) bucket: read from it when the region's relay is down or the "
                             "regional copy of a version is corrupt, unsigned or forged (default: no fallback; "
                             "never taken from the bucket's run.json)")
    parser.add_argument("--streams", type=int, help="parallel download streams (default AURORA_STREAMS or 4)")
    parser.add_argument("--cache-dir", help="local directory for snapshot files (vLLM loads from here)")
    parser.add_argument("--metrics-port", type=metrics.port_number, help=metrics.PORT_HELP)
    parser.add_argument("--trainer-public-key", default=CommandDefaults.from_env().trainer_public_key,
                        help="trainer's Ed25519 public key (file path or base64); manifests must verify against it")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generation batch")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full-sync", action="store_true",
                        help="stage every version from its full snapshot instead of its delta (the full-broadcast "
                             "baseline; needs the trainer to run with --snapshot-every 1)")
    parser.add_argument("--verify-full-digest", action="store_true",
                        help="after every activation, re-hash all weights from scratch and compare (slow)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="torch engine: where the model generates and deltas are scattered in place (auto: CUDA "
                             "when available); vLLM chooses its own platform")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                        help="vLLM: no CUDA graphs (default: on for the CPU backend only)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vLLM: fraction of GPU memory for weights and KV cache (default: vLLM's)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="vLLM: tensor-parallel ranks; each scatters its own slice of every delta")
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                        help="do not fetch announced segments before their manifest exists (the store-and-forward "
                             "baseline)")
    parser.add_argument("--prefetch-bytes", type=int, default=512 << 20,
                        help="memory for prefetched segments (held and in flight); beyond it, staging fetches")
    parser.add_argument("--cache-token", default=CommandDefaults.from_env().cache_token,
                        help="the run's bearer secret for the relay's segment cache (default AURORA_CACHE_TOKEN, "
                             "preferred: command lines are visible to other users); without one, buckets only")
    parser.add_argument("--cache-timeout", dest="cache_timeout_s", type=float, default=5.0,
                        help="seconds before a relay-cache read falls through to the bucket")
    parser.add_argument("--wait-for-run", dest="wait_for_run_s", type=float, default=1800.0,
                        help="seconds to wait for the run's first snapshot to appear before giving up (an actor "
                             "may start long before the trainer publishes; 0: wait for ever; default 1800)")
    return parser


def parse_args(argv: list[str] | None = None) -> ActorConfig:
    args = build_parser().parse_args(argv)
    return ActorConfig(
        bucket=args.bucket, redis=args.redis, region=args.region, run=args.run,
        engine=args.engine or default_engine(), actor_id=args.actor_id, source_bucket=args.source_bucket,
        streams=args.streams, cache_dir=args.cache_dir, metrics_port=args.metrics_port,
        trainer_public_key=args.trainer_public_key, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, seed=args.seed, verify_full_digest=args.verify_full_digest,
        full_sync=args.full_sync,
        prefetch=args.prefetch, prefetch_bytes=args.prefetch_bytes, cache_token=args.cache_token,
        cache_timeout_s=args.cache_timeout_s, wait_for_run_s=args.wait_for_run_s,
        engine_options=EngineOptions(args.device, args.enforce_eager, args.gpu_memory_utilization,
                                     args.tensor_parallel_size))
