"""Command line of ``python -m workers.relay``: the one place a relay's configuration is read."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aurora_store import metrics
from aurora_store.config import CommandDefaults, default_run_name


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
    serve_cache: bool = True  # serve the hot cache to the region's actors (needs cache_token)
    cache_token: str | None = None  # the run's bearer secret for the cache endpoint
    cache_bind: str | None = None  # None: this machine's private address (serve.private_address)
    cache_port: int = 8470
    cache_host: str | None = None  # the host name actors are told; None: this machine's name
    cache_connections: int = 16  # requests served at once; more get 503 (and read the regional bucket)
    cache_header_deadline_s: float = 5.0  # a connection's whole request line and headers, or it is closed
    cache_per_client: int = 8  # connections one address may hold before it has sent its headers
    store_and_forward: bool = False  # ignore segment events: copy a version only once its manifest exists


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"needs a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a positive whole number, got {text!r}")
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
    parser.add_argument("--metrics-port", type=metrics.port_number, help=metrics.PORT_HELP)
    parser.add_argument("--trainer-public-key", default=CommandDefaults.from_env().trainer_public_key,
                        help="trainer's Ed25519 public key; unsigned or mis-signed manifests are not forwarded")
    parser.add_argument("--stall-s", type=_positive_seconds, default=120.0,
                        help="stop heartbeating when no copy or loop iteration has completed for this many "
                             "seconds, so the region's actors read the source bucket instead (default 120)")
    parser.add_argument("--no-serve-cache", dest="serve_cache", action="store_false",
                        help="do not serve the hot cache to the region's actors (the store-and-forward baseline: "
                             "they wait for the regional bucket)")
    parser.add_argument("--cache-token", default=CommandDefaults.from_env().cache_token,
                        help="the run's bearer secret for the cache endpoint, shared with the region's actors "
                             "(default AURORA_CACHE_TOKEN, preferred: command lines are visible to other users); "
                             "without one the cache is not served")
    parser.add_argument("--cache-bind", help="address the cache endpoint listens on (default: this machine's "
                                             "private address, else loopback; 0.0.0.0 only when asked for)")
    parser.add_argument("--cache-port", type=int, default=8470, help="port of the cache endpoint (0: any free one)")
    parser.add_argument("--cache-host", help="host name the region's actors reach the endpoint at (default: this "
                                             "machine's name)")
    parser.add_argument("--cache-connections", type=int, default=16,
                        help="requests served at once; more are answered 503 (the reader uses its bucket)")
    parser.add_argument("--cache-header-deadline-s", type=_positive_seconds, default=5.0,
                        help="seconds a connection has to send its whole request line and headers (default 5)")
    parser.add_argument("--cache-per-client", type=_positive_int, default=8,
                        help="connections one client address may hold before sending its headers (default 8)")
    parser.add_argument("--store-and-forward", action="store_true",
                        help="copy a version only once its manifest is announced, not segment by segment as the "
                             "trainer uploads them (the baseline that benchmarks compare cut-through against)")
    return parser


def parse_args(argv: list[str] | None = None) -> RelayConfig:
    args = build_parser().parse_args(argv)
    return RelayConfig(source=args.source, dest=args.dest, redis=args.redis, region=args.region, run=args.run,
                       streams=args.streams, cache_dir=args.cache_dir, cache_bytes=args.cache_bytes,
                       metrics_port=args.metrics_port, trainer_public_key=args.trainer_public_key,
                       stall_s=args.stall_s, serve_cache=args.serve_cache, cache_token=args.cache_token,
                       cache_bind=args.cache_bind, cache_port=args.cache_port, cache_host=args.cache_host,
                       cache_connections=args.cache_connections,
                       cache_header_deadline_s=args.cache_header_deadline_s, cache_per_client=args.cache_per_client,
                       store_and_forward=args.store_and_forward)
