"""Command line of ``python -m workers.relay``: the one place a relay's configuration is read."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from aurora_store.config import default_run_name


@dataclass(frozen=True)
class RelayConfig:
    source: str
    dest: str
    redis: str
    region: str
    run: str
    streams: int | None
    cache_dir: str | None
    cache_bytes: int
    metrics_port: int | None
    trainer_public_key: str | None
    stall_s: float = 120.0  # no progress for this long: stop heartbeating so the region's actors fall back
    store_and_forward: bool = False  # ignore segment events: copy a version only once its manifest exists


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"needs a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.relay",
        description="A region's relay: copies each new version's segments from the source bucket into the "
                    "regional bucket as they appear (before the manifest), keeps a hot cache, writes the "
                    "manifest last and re-announces staged/commit events for its region.",
        epilog="example: python -m workers.relay --source s3://aurora-us/run1 --dest s3://aurora-eu/run1 "
               "--redis rediss://:pw@host:6379/0 --region eu-west-1")
    parser.add_argument("--source", required=True, help="the trainer's home bucket URL")
    parser.add_argument("--dest", required=True, help="this region's bucket URL")
    parser.add_argument("--redis", required=True, help="Redis URL of the control plane")
    parser.add_argument("--region", required=True, help="region this relay serves")
    parser.add_argument("--run", default=default_run_name())
    parser.add_argument("--streams", type=int, help="parallel copy streams (default AURORA_STREAMS or 4)")
    parser.add_argument("--cache-dir", help="disk tier of the hot cache (default: none)")
    parser.add_argument("--cache-bytes", type=int, default=256 << 20, help="memory tier of the hot cache")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--trainer-public-key", default=os.environ.get("AURORA_TRAINER_PUBLIC_KEY"),
                        help="trainer's Ed25519 public key; unsigned or mis-signed manifests are not forwarded")
    parser.add_argument("--stall-s", type=_positive_seconds, default=120.0,
                        help="stop heartbeating when no copy or loop iteration has completed for this many "
                             "seconds, so the region's actors read the source bucket instead (default 120)")
    parser.add_argument("--store-and-forward", action="store_true",
                        help="copy a version only once its manifest is announced, not segment by segment as the "
                             "trainer uploads them (the baseline that benchmarks compare cut-through against)")
    return parser


def parse_args(argv: list[str] | None = None) -> RelayConfig:
    args = build_parser().parse_args(argv)
    return RelayConfig(source=args.source, dest=args.dest, redis=args.redis, region=args.region, run=args.run,
                       streams=args.streams, cache_dir=args.cache_dir, cache_bytes=args.cache_bytes,
                       metrics_port=args.metrics_port, trainer_public_key=args.trainer_public_key,
                       stall_s=args.stall_s, store_and_forward=args.store_and_forward)
