"""Prometheus metrics of Aurora's processes (trainer, actor, relay), one registry per process.

Every process creates the same set of series (unused ones stay at zero), so dashboards and alerts can be
written once. A process serves them over HTTP only when given a port (``--metrics-port``); port 0 means any
free port, which the process logs once bound (``metrics_port`` in its ``serving metrics`` line).
"""

from __future__ import annotations

import argparse
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from aurora_store.errors import MetricsPortError

log = logging.getLogger("aurora.metrics")
PORT_HELP = "serve Prometheus metrics on this port (0: any free one, logged as metrics_port once bound)"
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    def __init__(self, process: str, run: str, region: str = "") -> None:
        self.registry = r = CollectorRegistry()
        Info("aurora_process", "Which Aurora process this is", registry=r).info(
            {"process": process, "run": run, "region": region})
        # versions
        self.version_published = Gauge("aurora_version_published", "Newest version published (trainer) or "
                                       "forwarded into the region (relay)", registry=r)
        self.version_committed = Gauge("aurora_version_committed", "Newest version actors were told to "
                                       "activate", registry=r)
        self.version_active = Gauge("aurora_version_active", "Version the actor generates on", registry=r)
        self.version_staged = Gauge("aurora_version_staged", "Version staged for activation (-1: none)", registry=r)
        self.version_lag = Gauge("aurora_version_lag", "Newest published version minus the active one", registry=r)
        # deltas
        self.delta_bytes = Gauge("aurora_delta_bytes", "Bytes of the newest delta (segments + manifest)",
                                 registry=r)
        self.delta_density = Gauge("aurora_delta_density", "Fraction of elements changed by the newest delta",
                                   registry=r)
        self.published_bytes = Counter("aurora_published_bytes", "Delta bytes published", registry=r)
        self.encode_seconds = Histogram("aurora_encode_seconds", "Delta extraction + encoding time",
                                        buckets=_SECONDS, registry=r)
        self.upload_seconds = Histogram("aurora_upload_seconds", "First segment handed to a stream until the last "
                                        "one is durable", buckets=_SECONDS, registry=r)
        self.publish_seconds = Histogram("aurora_publish_seconds", "Extraction start until the manifest is "
                                         "durable (trainer) / forwarded (relay)", buckets=_SECONDS, registry=r)
        self.fetch_seconds = Histogram("aurora_fetch_seconds", "Downloading, verifying and decoding one version",
                                       buckets=_SECONDS, registry=r)
        self.activate_seconds = Histogram("aurora_activate_seconds", "In-place scatter of a staged version",
                                          buckets=_SECONDS, registry=r)
        self.downloaded_bytes = Counter("aurora_downloaded_bytes", "Bytes downloaded from buckets", registry=r)
        self.catch_up = Counter("aurora_catch_up_decisions", "Catch-up plans of an actor behind its bucket's newest "
                                "version, by path chosen (replay, snapshot) and cause (behind: more than one "
                                "version out; missing: the next delta is gone)", ["path", "cause"], registry=r)
        # relays
        self.cross_region_bytes = Counter("aurora_cross_region_bytes", "Bytes copied from the source bucket into "
                                          "the region", registry=r)
        self.cache_hits = Counter("aurora_cache_hits", "Hot-cache hits", registry=r)
        self.cache_misses = Counter("aurora_cache_misses", "Hot-cache misses", registry=r)
        self.cache_hit_ratio = Gauge("aurora_cache_hit_ratio", "Hot-cache hits / lookups", registry=r)
        self.cache_served_bytes = Counter("aurora_cache_served_bytes", "Segment bytes the relay's cache served to "
                                          "its region's actors", registry=r)
        self.cache_refused = Counter("aurora_cache_refused", "Cache requests refused, by reason (auth: missing or "
                                     "wrong token, busy: over the concurrency or per-client bound, slow: no "
                                     "request line and headers within the deadline)", ["reason"], registry=r)
        self.events_dropped = Counter("aurora_events_dropped", "Version events not acted on, by reason (a version "
                                      "out of the window, not in the bucket, a bound reached, …)", ["reason"],
                                      registry=r)
        # actors: where segment bytes came from, prefetching
        self.segment_reads = Counter("aurora_segment_reads", "Segments an actor read, by source (prefetched, "
                                     "relay_cache, bucket)", ["source"], registry=r)
        self.relay_cache_reads = Counter("aurora_relay_cache_reads", "An actor's reads from its relay's cache, by "
                                         "outcome (hit, miss, error, corrupt)", ["outcome"], registry=r)
        self.prefetched_bytes = Counter("aurora_prefetched_bytes", "Segment bytes fetched before their manifest "
                                        "was read", registry=r)
        self.prefetch_dropped_bytes = Counter("aurora_prefetch_dropped_bytes", "Prefetched bytes dropped unused "
                                              "(not named by the manifest, or superseded)", registry=r)
        self.decoded_ahead = Counter("aurora_decoded_ahead_segments", "Segments decoded and hashed before their "
                                     "manifest was read, that staging then only checked", registry=r)
        self.staged_after_manifest_seconds = Histogram("aurora_staged_after_manifest_seconds", "From the actor "
                                                       "learning of a version's manifest until it is staged",
                                                       buckets=_SECONDS, registry=r)
        # generation
        self.tokens_per_second = Gauge("aurora_tokens_per_second", "Measured generation throughput", registry=r)
        self.tokens = Counter("aurora_tokens_generated", "Tokens generated", registry=r)
        # scheduling (trainer)
        self.leases = Counter("aurora_leases", "Lease events", ["event"], registry=r)
        self.results = Counter("aurora_results_received", "Results and lease returns received", registry=r)
        self.rollouts = Counter("aurora_rollouts", "Settled rollouts by outcome and reason", ["outcome", "reason"],
                                registry=r)
        self.share = Gauge("aurora_scheduler_share", "Prompts allocated to an actor in the latest step", ["actor"],
                           registry=r)
        self.throughput_estimate = Gauge("aurora_throughput_estimate", "Scheduler's tokens/s estimate", ["actor"],
                                         registry=r)
        self.step = Gauge("aurora_step", "Optimizer steps done", registry=r)
        self.reward = Gauge("aurora_reward", "Mean reward of the latest step's rollouts", registry=r)
        for event in ("granted", "expired", "returned"):
            self.leases.labels(event)
        for reason in ("auth", "busy", "slow"):
            self.cache_refused.labels(reason)
        for source in ("prefetched", "relay_cache", "bucket"):
            self.segment_reads.labels(source)
        for outcome in ("hit", "miss", "error", "corrupt"):
            self.relay_cache_reads.labels(outcome)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve the registry over HTTP on ``port`` and return the port bound. Port 0 lets the kernel choose at
        bind time: a launcher that picked a free port itself and passed it on would leave a window, until this
        process binds it, in which another process can take it (then this one fails, or its scraper reads the
        other one's)."""
        try:
            server, _ = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise MetricsPortError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} (another "
                                   "--metrics-port, or 0 for any free one)") from exc
        bound = int(server.server_port)
        log.info("serving metrics", extra={"metrics_port": bound})
        return bound

    def update_cache(self, hits: int, misses: int) -> None:
        lookups = hits + misses
        self.cache_hit_ratio.set(hits / lookups if lookups else 0.0)


def port_number(text: str) -> int:
    """``--metrics-port``'s type: a TCP port, 0 to 65535 (0: the kernel picks one at bind time)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"needs a TCP port from 0 to 65535, got {text!r}")
    return port
