"""Parts 1–4: delivery of one version to the remote region, measured by agents in the namespaces.

1. :func:`deliver_sweep` — full weights vs delta across link rates (paper Fig. 14).
2. :func:`streams_sweep` — one delta over 1 vs S parallel streams under RTT and random loss.
3. :func:`cut_through` — publish start → remote actor staged, streaming upload vs encode-then-upload, with the
   real relay (``python -m workers.relay``) copying in the remote region.
   :func:`overlap` (also part 3) — publish start → the last of two remote actors staged, full cut-through
   (streaming upload, relay copying on segment events, actors prefetching — from the relay's cache when it
   serves one — and decoding each segment as it arrives) vs
   store-and-forward (encode then upload, relay copying after the manifest, actors after the regional
   manifest), with per-stage times.
4. :func:`relay_vs_direct` — four remote actors, through the relay vs each straight from the home bucket:
   bytes counted on the link and time until all four have staged the version.

Parts 3–4 publish ``v2`` (base ``v1``, the bigger delta) with the trainer's code path from an agent in home and
time it from publish start to "staged" in remote actor agents (wall clocks of one machine). Each relay first
forwards ``v1`` (:func:`warm_relay`), so the measured version meets it in steady state.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.wan_bench.config import BenchConfig
from benchmarks.wan_bench.env import HOME, REMOTE, Agent, WanEnv
from benchmarks.wan_bench.model import ModelData, seed_run_bucket

log = logging.getLogger("aurora.bench.wan")


def summarize(values: Sequence[float]) -> dict[str, float]:
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "mean": statistics.fmean(vals), "min": min(vals), "max": max(vals),
            "n": len(vals)}


def _transfer_timeout(nbytes: int, rate_mbit: float | None, floor: float = 120.0) -> float:
    """Generous: four times the ideal transfer time (lossy links are slower), never below ``floor``."""
    if not rate_mbit:
        return floor
    return max(floor, 4 * nbytes * 8 / (rate_mbit * 1e6) + 60)


def _measured(env: WanEnv, agent: Agent, timeout: float, **command: Any) -> dict[str, Any]:
    """One ``deliver`` with the link's counters over exactly that transfer."""
    env.reset_link()
    result = agent.call("deliver", timeout=timeout, **command)
    result["link"] = env.link_counters()
    if result["link"]["dropped_overrun"]:
        log.warning("forwarder overrun during %s: results are not trustworthy", command)
    return result


# --- part 1 --------------------------------------------------------------------------------------


def deliver_sweep(env: WanEnv, cfg: BenchConfig, data: ModelData, agent: Agent, url: str,
                  seeded: dict[str, Any]) -> dict[str, Any]:
    agent.call("load", config=data.config, state_file=data.files[0], version=0, digest=data.digests[0])
    points = []
    for rate in cfg.rates_mbit:
        cal = env.shape(rate, cfg.deliver_rtt_ms, 0.0, calibrate=f"deliver_{rate:g}mbit")
        deltas = [_measured(env, agent, _transfer_timeout(seeded["delta_bytes"], rate), url=url, mode="delta",
                            version=1, streams=cfg.deliver_streams) for _ in range(cfg.delta_repeats)]
        fulls = [_measured(env, agent, _transfer_timeout(seeded["snapshot_bytes"], rate), url=url, mode="full",
                           version=1, streams=cfg.deliver_streams) for _ in range(cfg.full_repeats)]
        delta_s = statistics.median(r["seconds"] for r in deltas)
        full_s = statistics.median(r["seconds"] for r in fulls)
        points.append({
            "rate_mbit": rate, "full_s": full_s, "delta_s": delta_s, "speedup": full_s / delta_s,
            "full_goodput_mbit": fulls[0]["bytes"] * 8 / fulls[0]["seconds"] / 1e6,
            "full_bytes": fulls[0]["bytes"], "delta_bytes": deltas[0]["bytes"],
            "delta_runs": deltas, "full_runs": fulls,
            "achieved_rate_mbit": cal["rate_mbit"] if cal else None,
        })
        log.info("deliver @ %g Mbit/s: full %.1f s, delta %.2f s (%.0fx)", rate, full_s, delta_s, full_s / delta_s)
    lowest = min(points, key=lambda p: p["rate_mbit"])
    return {"rtt_ms": cfg.deliver_rtt_ms, "loss": 0.0, "streams": cfg.deliver_streams, "points": points,
            "speedup_lowest_rate": lowest["speedup"], "full_s_lowest_rate": lowest["full_s"],
            "delta_s_lowest_rate": lowest["delta_s"], **seeded}


# --- part 2 --------------------------------------------------------------------------------------


def streams_sweep(env: WanEnv, cfg: BenchConfig, data: ModelData, agent: Agent, url: str,
                  seeded: dict[str, Any]) -> dict[str, Any]:
    agent.call("load", config=data.config, state_file=data.files[1], version=1, digest=data.digests[1])
    per_loss = []
    timeout = _transfer_timeout(seeded["delta_bytes"], 2.0)  # a single flow at 1 % loss can be very slow
    for loss in cfg.losses:
        cal = env.shape(cfg.streams_rate_mbit, cfg.streams_rtt_ms, loss, calibrate=f"streams_loss{loss:g}")
        runs: dict[int, list[dict[str, Any]]] = {s: [] for s in cfg.stream_counts}
        for _ in range(cfg.streams_repeats):  # interleaved, so slow drifts of the machine hit every count alike
            for streams in cfg.stream_counts:
                runs[streams].append(_measured(env, agent, timeout, url=url, mode="delta", version=2,
                                               streams=streams))
        by_streams = {str(s): {**summarize([r["seconds"] for r in rs]),
                               "fetch": summarize([r["fetch_s"] for r in rs]), "runs": rs}
                      for s, rs in runs.items()}
        base = by_streams[str(cfg.stream_counts[0])]["median"]
        speedups = {s: base / v["median"] for s, v in by_streams.items()}
        per_loss.append({"loss": loss, "by_streams": by_streams, "speedup_vs_1": speedups, "link": cal})
        log.info("streams @ loss %g: %s", loss, {s: round(v["median"], 2) for s, v in by_streams.items()})
    return {"rate_mbit": cfg.streams_rate_mbit, "rtt_ms": cfg.streams_rtt_ms, "points": per_loss, **seeded}


def speedup_4v1(streams: dict[str, Any] | None, loss: float) -> float | None:
    if not streams:
        return None
    for point in streams["points"]:
        if abs(point["loss"] - loss) < 1e-12 and "4" in point["by_streams"] and "1" in point["by_streams"]:
            return point["by_streams"]["1"]["median"] / point["by_streams"]["4"]["median"]
    return None


# --- parts 3 and 4 -------------------------------------------------------------------------------


class Publishing:
    """The home-side publisher agent and the remote actor agents of parts 3–4, all holding ``v1``."""

    def __init__(self, env: WanEnv, cfg: BenchConfig, data: ModelData, first: Agent) -> None:
        self.env, self.cfg, self.data = env, cfg, data
        self.publisher = env.agent(HOME, "publisher", wait=False)
        others = [env.agent(REMOTE, f"actor{i}", wait=False) for i in range(2, cfg.relay_actors + 1)]
        self.actors = [first, *others]
        load = {"config": data.config, "state_file": data.files[1], "version": 1, "digest": data.digests[1]}
        for agent in [self.publisher, *others]:
            agent.wait_ready()
        for agent in self.all:
            agent.send("load", **load)
        for agent in self.all:
            agent.receive(300)
        self.publisher.call("load_new", state_file=data.files[2], timeout=300)

    @property
    def all(self) -> list[Agent]:
        return [self.publisher, *self.actors]

    def run_once(self, run: str, home_url: str, actors: Sequence[Agent], *, watch_region: str, fetch_url: str,
                 cut_through: bool, count_link: bool = False) -> dict[str, Any]:
        cfg, env = self.cfg, self.env
        for agent in actors:
            agent.call("watch", redis=env.redis.url, run=run, region=watch_region, timeout=60)
        for agent in actors:
            agent.send("await_stage", version=2, url=fetch_url, streams=4, timeout=600)
        if count_link:
            env.reset_link()
        pub = self.publisher.call("publish", timeout=600, url=home_url, redis=env.redis.url, run=run, region=HOME,
                                  version=2, base_version=1, cut_through=cut_through, streams=4,
                                  segment_bytes=cfg.big_segment_bytes)
        staged = [agent.receive(660) for agent in actors]
        link = env.link_counters() if count_link else None
        t0 = pub.pop("t_start")
        pub["manifest_s"] = pub.pop("t_manifest") - t0  # publish start → manifest durable
        pub["announced_s"] = pub.pop("t_end") - t0  # … → staged event sent
        return {
            "run": run, "cut_through": cut_through, "publish": pub,
            "delivery_s": max(s["t_staged"] for s in staged) - t0,
            "actors": [{"event_s": s["t_event"] - t0, "staged_s": s["t_staged"] - t0, "stage_s": s["stage_s"]}
                       for s in staged],
            "delta_bytes": pub["bytes"], "link": link,
        }


def warm_relay(env: WanEnv, data: ModelData, run: str, home_url: str, timeout: float = 300.0) -> float:
    """Send version 1 (``D_1``, base of the measured ``v2``) through the run's relay and wait until the region
    has it, so the measured version meets a relay in steady state, as in a long run.

    A relay makes its S3 clients lazily, one per copy thread, on the thread's first copy; on a busy 2-core
    machine creating a few in parallel takes seconds, a one-off cost that has nothing to do with the version
    being measured. Segments are small and announced in one burst after upload so every copy thread starts.
    """
    from aurora_store.bus import ControlPlane, VersionEvent
    from aurora_store.codec import CodecParams, WeightsDigest, pieces_from_states
    from aurora_store.store import DeltaStore, object_names, open_bucket
    from aurora_store.store.publisher import VersionPublisher

    started = time.monotonic()
    plane = ControlPlane(env.redis.url, run)
    store = DeltaStore(open_bucket(home_url))
    try:
        cursor = plane.latest_event_id(REMOTE)
        publisher = VersionPublisher(store, data.layout, CodecParams(segment_bytes=64 * 1024), streams=4,
                                     record_history=False)
        report = publisher.publish(1, 0, WeightsDigest.parse(data.digests[0]),
                                   pieces_from_states(data.layout, data.states[0], data.states[1]))
        for ref in report.manifest.segments:
            plane.announce(VersionEvent("segment", 1, HOME, segment=ref.digest, size=ref.size))
        plane.announce(VersionEvent("staged", 1, HOME, base=0, manifest_key=object_names.delta(1),
                                    weights_digest=report.manifest.weights_digest, sent_ms=plane.now_ms()))
        while True:
            for _, entry_id, event in plane.read_events({REMOTE: cursor}, block_ms=200):
                cursor = entry_id
                if event.kind == "staged" and event.version == 1:
                    return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"relay of {run} did not forward the warm-up version in {timeout:.0f}s")
    finally:
        store.close()
        plane.close()


def start_relay_run(env: WanEnv, run: str) -> tuple[str, str]:
    """Fresh home and regional buckets for ``run`` and a relay between them (it imports while others work)."""
    home_url = env.bucket(HOME, run)
    remote_url = env.bucket(REMOTE, run)
    seed_run_bucket(home_url, run)
    env.start_relay(run, home_url, remote_url)
    return home_url, remote_url


def cut_through(env: WanEnv, cfg: BenchConfig, pub: Publishing, runs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    env.shape(cfg.cut_rate_mbit, cfg.cut_rtt_ms, 0.0, calibrate=f"cut_{cfg.cut_rate_mbit:g}mbit")
    results: dict[str, list[dict[str, Any]]] = {"cut_through": [], "encode_then_upload": []}
    for rep in range(cfg.cut_repeats):
        for mode in (False, True):
            run = f"p3-{'ct' if mode else 'nct'}-{rep}"
            home_url, remote_url = runs[run]
            env.wait_relay(run)
            warm_relay(env, pub.data, run, home_url)
            result = pub.run_once(run, home_url, pub.actors[:1], watch_region=REMOTE, fetch_url=remote_url,
                                  cut_through=mode)
            env.stop_relay(run)
            results["cut_through" if mode else "encode_then_upload"].append(result)
            log.info("%s: %.2f s (publish %.2f s)", run, result["delivery_s"], result["publish"]["publish_s"])
    ct = summarize([r["delivery_s"] for r in results["cut_through"]])
    nct = summarize([r["delivery_s"] for r in results["encode_then_upload"]])
    return {"rate_mbit": cfg.cut_rate_mbit, "rtt_ms": cfg.cut_rtt_ms, "cut_through_s": ct,
            "encode_then_upload_s": nct, "speedup": nct["median"] / ct["median"], "runs": results}


def part3(env: WanEnv, cfg: BenchConfig, pub: Publishing, runs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Part 3: :func:`cut_through` and :func:`overlap`, with each region on its own CPUs when configured
    (``cut_pin_regions``); ``cpus`` says how they were split (``None``: not pinned)."""
    pinning = env.regions_on_own_cpus() if cfg.cut_pin_regions else contextlib.nullcontext()
    with pinning as cpus:
        doc = cut_through(env, cfg, pub, runs)
        doc["overlap"] = overlap(env, cfg, pub)
    doc["cpus"] = {region: sorted(c) for region, c in cpus.items()} if cpus else None
    return doc


def relay_vs_direct(env: WanEnv, cfg: BenchConfig, pub: Publishing, relay_run: str,
                    urls: tuple[str, str]) -> dict[str, Any]:
    cal = env.shape(cfg.relay_rate_mbit, cfg.relay_rtt_ms, 0.0, calibrate=f"relay_{cfg.relay_rate_mbit:g}mbit")
    actors = pub.actors[: cfg.relay_actors]
    # through the relay: one cross-region copy, actors read the regional bucket
    env.wait_relay(relay_run)
    home_url, remote_url = urls
    warm_relay(env, pub.data, relay_run, home_url)
    time.sleep(1.5)  # one relay heartbeat: its counter then includes the warm-up version, which is not measured
    warm = env.relay_state(relay_run)
    relayed = pub.run_once(relay_run, home_url, actors, watch_region=REMOTE, fetch_url=remote_url,
                           cut_through=True, count_link=True)
    time.sleep(1.5)  # one relay heartbeat, so its counters include the copy
    state = env.relay_state(relay_run)
    relayed["relay_bytes_copied"] = (state.bytes_copied - (warm.bytes_copied if warm else 0)) if state else None
    env.stop_relay(relay_run)
    # direct: no relay, every actor reads the home bucket across the link
    direct_run = "p4-direct"
    direct_url = env.bucket(HOME, direct_run)
    seed_run_bucket(direct_url, direct_run)
    direct = pub.run_once(direct_run, direct_url, actors, watch_region=HOME, fetch_url=direct_url,
                          cut_through=True, count_link=True)
    delta_bytes = relayed["delta_bytes"]
    relay_copies = relayed["link"]["down_bytes"] / delta_bytes
    direct_copies = direct["link"]["down_bytes"] / delta_bytes
    log.info("relay: %.2f copies, %.2f s; direct: %.2f copies, %.2f s", relay_copies, relayed["delivery_s"],
             direct_copies, direct["delivery_s"])
    return {
        "rate_mbit": cfg.relay_rate_mbit, "rtt_ms": cfg.relay_rtt_ms, "actors": len(actors), "regions": 1,
        "delta_bytes": delta_bytes,
        "relay": {"cross_region_bytes": relayed["link"]["down_bytes"], "copies": relay_copies,
                  "all_staged_s": relayed["delivery_s"],
                  "relay_counter_copies": (relayed["relay_bytes_copied"] / relayed["publish"]["segment_bytes"]
                                           if relayed["relay_bytes_copied"] is not None else None),
                  "run": relayed},
        "direct": {"cross_region_bytes": direct["link"]["down_bytes"], "copies": direct_copies,
                   "all_staged_s": direct["delivery_s"], "run": direct},
        "time_speedup": direct["delivery_s"] / relayed["delivery_s"],
        "bytes_note": "IP bytes the forwarder delivered home → remote during the run (TCP/IP and HTTP headers, "
                      "Redis notifications and the relay's periodic listing included), divided by the delta's "
                      "segment + manifest bytes",
        "link": cal,
    }


# --- part 3, end to end: cut-through vs store-and-forward ------------------------------------------


def _relay_options() -> set[str]:
    """The relay's command-line options on this checkout (flags of features that may not exist here are only
    passed when the relay knows them)."""
    from workers.relay.cli import build_parser

    return {option for action in build_parser()._actions for option in action.option_strings}


def _relay_args(mode: str, env: WanEnv, known: set[str]) -> tuple[list[str], list[str]]:
    """The relay's extra arguments for ``mode`` and those of them this checkout's relay lacks."""
    if mode == "store_and_forward":
        wanted = [["--store-and-forward"], ["--no-serve-cache"]]
    else:  # serve the hot cache to the region's actors at the remote namespace's address, any free port
        wanted = [["--cache-host", env.topo.address(REMOTE)], ["--cache-bind", env.topo.address(REMOTE)],
                  ["--cache-port", "0"]]
    args = [a for flag in wanted if flag[0] in known for a in flag]
    return args, [flag[0] for flag in wanted if flag[0] not in known]


def _overlap_once(env: WanEnv, cfg: BenchConfig, pub: Publishing, run: str, urls: tuple[str, str], mode: str,
                  token: str) -> dict[str, Any]:
    home_url, remote_url = urls
    cut = mode == "cut_through"
    actors = pub.actors[: cfg.overlap_actors]
    for agent in actors:
        agent.call("watch", redis=env.redis.url, run=run, region=REMOTE, home=HOME, timeout=60)
    for agent in actors:
        agent.send("follow", version=2, url=remote_url, streams=4, prefetch=cut, cache_token=token,
                   segment_bytes=cfg.big_segment_bytes, timeout=600)
    pub_doc = pub.publisher.call("publish", timeout=600, url=home_url, redis=env.redis.url, run=run, region=HOME,
                                 version=2, base_version=1, cut_through=cut, streams=4,
                                 segment_bytes=cfg.big_segment_bytes)
    staged = [agent.receive(660) for agent in actors]
    t0 = pub_doc.pop("t_start")
    manifest_s = pub_doc.pop("t_manifest") - t0
    pub_doc.pop("t_end")
    arrivals = [t - t0 for s in staged for t in s["prefetch_arrivals"]]
    reads = {"relay_cache": sum(s["reads"].get("relay_cache", 0) for s in staged),
             "bucket": sum(s["reads"].get("bucket", 0) for s in staged)}
    actor_staged = sorted(s["t_staged"] - t0 for s in staged)
    region_staged = min(s["t_event"] - t0 for s in staged)  # the relay's regional "staged": the WAN copy is done
    home_first = pub_doc["first_segment_s"]
    return {
        "mode": mode, "run": run, "total_s": actor_staged[-1],
        # extraction + encoding at home: CPU seconds, and when the first segment / the manifest were durable
        "extract_encode": {"encode_s": pub_doc["encode_s"], "first_segment_home_s": home_first,
                           "manifest_s": manifest_s},
        # across the link: the relay's copy, from the first segment readable in the region (an actor's first
        # prefetched read; store-and-forward has none) to the regional manifest
        "wan_copy": {"first_segment_region_s": min(arrivals) if arrivals else None,
                     "last_segment_region_s": max(arrivals) if arrivals else None,
                     "region_staged_s": region_staged,
                     "seconds": region_staged - (home_first if cut else manifest_s)},
        # inside the region: the regional manifest → every actor staged (fetch what is missing, verify, decode)
        "fanout": {"first_actor_staged_s": actor_staged[0], "last_actor_staged_s": actor_staged[-1],
                   "seconds": actor_staged[-1] - region_staged},
        "reads": reads, "cache_url": staged[0]["cache_url"],
        "prefetched_segments": sum(s["announced"] for s in staged), "segments": staged[0]["segments"],
        "actors": [{"event_s": s["t_event"] - t0, "staged_s": s["t_staged"] - t0, "stage_s": s["stage_s"],
                    "decoded_ahead": s["decoded_ahead"]} for s in staged],
        "publish": pub_doc,
    }


def overlap(env: WanEnv, cfg: BenchConfig, pub: Publishing) -> dict[str, Any]:
    """Publish start → the last remote actor staged, full cut-through vs store-and-forward, on one link.

    The same agents, link and model in both modes; each run has fresh buckets and its own relay (started with
    the mode's flags, those this checkout's relay knows), warmed with ``v1`` first. Cut-through actors decode
    each prefetched segment as it arrives (:class:`~aurora_store.codec.ahead.AheadStager`).
    ``relay_cache_hit_ratio``: the share of the remote actors' segment reads the relay's hot cache answered in
    cut-through mode (None when the relay serves no cache).
    """
    import secrets

    cal = env.shape(cfg.overlap_rate_mbit, cfg.overlap_rtt_ms, 0.0, calibrate=f"overlap_{cfg.overlap_rate_mbit:g}mbit")
    known = _relay_options()
    token = secrets.token_hex(16)
    modes = ("store_and_forward", "cut_through")
    runs: dict[tuple[int, str], tuple[str, tuple[str, str]]] = {}
    missing: set[str] = set()
    for rep in range(cfg.overlap_repeats):  # every relay imports at once, before anything is timed
        for mode in modes:
            run = f"p3o-{'sf' if mode == 'store_and_forward' else 'ct'}-{rep}"
            home_url, remote_url = env.bucket(HOME, run), env.bucket(REMOTE, run)
            seed_run_bucket(home_url, run)
            args, lacking = _relay_args(mode, env, known)
            missing.update(lacking)
            env.start_relay(run, home_url, remote_url, extra=args, env={"AURORA_CACHE_TOKEN": token})
            runs[rep, mode] = run, (home_url, remote_url)
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rep in range(cfg.overlap_repeats):
        for mode in modes:
            run, urls = runs[rep, mode]
            env.wait_relay(run)
            warm_relay(env, pub.data, run, urls[0])
            result = _overlap_once(env, cfg, pub, run, urls, mode, token)
            env.stop_relay(run)
            results[mode].append(result)
            log.info("%s: last actor staged at %.2f s (encode %.2f s, WAN %.2f s, fanout %.2f s)", run,
                     result["total_s"], result["extract_encode"]["encode_s"], result["wan_copy"]["seconds"],
                     result["fanout"]["seconds"])
    ct = summarize([r["total_s"] for r in results["cut_through"]])
    sf = summarize([r["total_s"] for r in results["store_and_forward"]])
    reads = {k: sum(r["reads"][k] for r in results["cut_through"]) for k in ("relay_cache", "bucket")}
    served = any(r["cache_url"] for r in results["cut_through"])
    # One segment's transfer time on this link: with cut-through, what is left for the actors once the regional
    # manifest exists (verify, decode the last segments, digest) should be a small fraction of it.
    segment_transfer_s = cfg.big_segment_bytes * 8 / (cal["rate_mbit"] * 1e6)
    stages = {mode: {stage: summarize([r[stage]["seconds"] for r in rs]) for stage in ("wan_copy", "fanout")}
              | {"encode_s": summarize([r["extract_encode"]["encode_s"] for r in rs]),
                 "manifest_s": summarize([r["extract_encode"]["manifest_s"] for r in rs])}
              for mode, rs in results.items()}
    return {
        "rate_mbit": cfg.overlap_rate_mbit, "rtt_ms": cfg.overlap_rtt_ms, "actors": cfg.overlap_actors,
        "cut_through_s": ct, "store_and_forward_s": sf, "ratio": ct["median"] / sf["median"], "stages": stages,
        "relay_cache_hit_ratio": (reads["relay_cache"] / max(1, sum(reads.values()))) if served else None,
        "segment_transfer_s": segment_transfer_s,
        "fanout_vs_segment_transfer": stages["cut_through"]["fanout"]["median"] / segment_transfer_s,
        "relay_cache_note": None if served else
        "the relay serves no hot cache on this checkout (no cache_url in its state): actors read the regional "
        "bucket as soon as the relay has written each segment",
        "flags_missing": sorted(missing), "reads": reads, "runs": results, "link": cal,
    }
