"""Runs the WAN benchmark and assembles its one JSON object (see :mod:`benchmarks.wan_bench`)."""

from __future__ import annotations

import logging
import os
import platform
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.wan_bench import e2e, measure, model, plots
from benchmarks.wan_bench.config import PARTS, BenchConfig, E2EConfig
from benchmarks.wan_bench.env import HOME, REMOTE, WanEnv

log = logging.getLogger("aurora.bench.wan")

TARGETS = {
    "delta_vs_full_speedup_lowest_rate": (">=", 20.0, "delta at least 20x faster than full at the lowest rate"),
    "streams4_vs_1_speedup_loss1pct": (">=", 1.3, "4 streams at least 1.3x faster than 1 at 1 % loss"),
    "relay_cross_region_copies_per_version": ("<=", 1.15, "one cross-region copy per region (+ header overhead)"),
    "cut_through_vs_store_and_forward": ("<=", 0.6, "publish start → last remote actor staged: full cut-through "
                                                    "within 60 % of store-and-forward"),
    "fanout_vs_segment_transfer": ("<=", 0.5, "cut-through: regional manifest → last remote actor staged within "
                                              "half of one segment's transfer time on the link"),
}
# Part 5 is judged by its 95 % interval, not its point: precise enough (no wider than the configured ±3 %), delta not
# measurably faster than ideal (that would be noise: delta does all ideal does and more), and within 10 % of it.
E2E_LOW, E2E_HIGH = 0.97, 1.10


def run(cfg: BenchConfig, out_dir: Path) -> dict[str, Any]:
    """Build the world, run the selected parts, write plots; return the result document."""
    started = time.monotonic()
    out_dir = Path(out_dir).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    unknown = set(cfg.parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {list(PARTS)}")
    doc: dict[str, Any] = {
        "bench": "wan", "mode": "quick" if cfg.quick else "full", "parts": list(cfg.parts),
        "host": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg(), "kernel": platform.release()},
        "config": cfg.to_dict(), "errors": {},
    }

    def part(name: str, fn: Callable[[], Any], *, enabled: bool | None = None) -> Any:
        if not (name in cfg.parts if enabled is None else enabled):
            return None
        t0 = time.monotonic()
        log.info("part %s ...", name)
        try:
            value = fn()
        except Exception as exc:  # keep going: the other parts are still worth having
            log.error("part %s failed: %s", name, exc)
            doc["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
            return None
        log.info("part %s done in %.0f s", name, time.monotonic() - t0)
        doc.setdefault("part_seconds", {})[name] = round(time.monotonic() - t0, 1)
        return value

    log.info("starting namespaces, link and servers ...")
    with tempfile.TemporaryDirectory(prefix="aurora-wan-") as work, \
            WanEnv(out_dir, seed=cfg.seed, calibrate_seconds=cfg.calibrate_seconds) as env:
        doc["setup_s"] = round(time.monotonic() - started, 1)
        log.info("topology %s* up in %.1f s", env.topo.prefix, doc["setup_s"])
        synthetic = [p for p in PARTS[:4] if p in cfg.parts]
        data = None
        first = None
        if synthetic:
            # Compiled once here, the kernels are in numba's on-disk cache before any agent starts: on a fresh
            # checkout each agent would otherwise compile them itself, on the clock of its first measurement.
            from aurora_store.codec.warm import warm_kernels

            warm_kernels()
            first = env.agent(REMOTE, "actor1", wait=False)  # imports while the model is built
            data = model.build(cfg, Path(work))
            doc["model"] = data.describe()
            log.info("synthetic model: %d parameters, built in %.0f s", data.layout.numel, data.build_s)
            first.wait_ready()

        def deliver() -> dict[str, Any]:
            url = env.bucket(HOME, "p1-deliver")
            seeded = model.seed_deliver_bucket(data, url, cfg.snapshot_shards)
            doc["model"].update(seeded)
            return measure.deliver_sweep(env, cfg, data, first, url, seeded)

        def streams() -> dict[str, Any]:
            url = env.bucket(HOME, "p2-streams")
            seeded = model.seed_streams_bucket(data, url, cfg.big_segment_bytes)
            return measure.streams_sweep(env, cfg, data, first, url, seeded)

        doc["deliver"] = part("deliver", deliver)
        doc["streams"] = part("streams", streams)
        publishing = None
        relay_runs: dict[str, tuple[str, str]] = {}
        if "cut_through" in cfg.parts or "relay" in cfg.parts:
            def setup() -> measure.Publishing:
                if "cut_through" in cfg.parts:
                    for rep in range(cfg.cut_repeats):
                        for mode in ("nct", "ct"):
                            name = f"p3-{mode}-{rep}"
                            relay_runs[name] = measure.start_relay_run(env, name)
                if "relay" in cfg.parts:
                    relay_runs["p4-relay"] = measure.start_relay_run(env, "p4-relay")
                return measure.Publishing(env, cfg, data, first)

            publishing = part("publishing_setup", setup, enabled=True)
        if publishing is not None:
            doc["cut_through"] = part("cut_through", lambda: measure.part3(env, cfg, publishing, relay_runs))
            doc["relay_vs_direct"] = part("relay", lambda: measure.relay_vs_direct(
                env, cfg, publishing, "p4-relay", relay_runs["p4-relay"]))
            for agent in publishing.all:
                agent.close()
        elif first is not None:
            first.close()
        doc["e2e"] = part("e2e", lambda: e2e.run(env, cfg.e2e, out_dir / "e2e"))
        doc["links"] = env.calibrations

    _summarize(doc)
    doc["plots"] = _plots(doc, out_dir)
    doc["runtime_s"] = round(time.monotonic() - started, 1)
    return _rounded(doc)


def _rounded(value: Any) -> Any:
    """Floats to 3 decimals (4 significant digits below 0.01): readable output, no false precision."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if abs(value) < 0.01 else round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def _summarize(doc: dict[str, Any]) -> None:
    deliver, streams = doc.get("deliver"), doc.get("streams")
    relay, ct, e2e_doc = doc.get("relay_vs_direct"), doc.get("cut_through"), doc.get("e2e")
    doc["delta_vs_full_speedup_lowest_rate"] = deliver["speedup_lowest_rate"] if deliver else None
    doc["streams4_vs_1_speedup_loss1pct"] = measure.speedup_4v1(streams, 0.01)
    doc["streams4_vs_1_speedup_loss01pct"] = measure.speedup_4v1(streams, 0.001)
    doc["cut_through_speedup"] = ct["speedup"] if ct else None
    overlap = ct.get("overlap") if ct else None
    doc["cut_through_vs_store_and_forward"] = overlap["ratio"] if overlap else None
    doc["relay_cache_hit_ratio"] = overlap["relay_cache_hit_ratio"] if overlap else None
    doc["fanout_vs_segment_transfer"] = overlap["fanout_vs_segment_transfer"] if overlap else None
    doc["relay_cross_region_copies_per_version"] = relay["relay"]["copies"] / relay["regions"] if relay else None
    doc["direct_cross_region_copies_per_version"] = relay["direct"]["copies"] / relay["regions"] if relay else None
    doc["relay_vs_direct_time_speedup"] = relay["time_speedup"] if relay else None
    for key in ("delta_vs_ideal", "delta_vs_ideal_ci95", "full_vs_delta", "full_vs_delta_ci95"):
        doc[f"e2e_{key}"] = e2e_doc.get(key) if e2e_doc else None
    for key in ("delta_sf_vs_ideal", "delta_sf_vs_ideal_ci95", "delta_vs_delta_sf", "delta_vs_delta_sf_ci95"):
        if e2e_doc and key in e2e_doc:  # only when the delta_sf mode ran
            doc[f"e2e_{key}"] = e2e_doc[key]
    doc["e2e_modes"] = None if not e2e_doc else {
        mode: {k: m[k] for k in ("mean_step_s", "median_step_s", "stdev_step_s", "intervals")}
        for mode, m in e2e_doc["modes"].items()}
    links = doc.get("links") or {}
    main = None
    if deliver:
        main = links.get(f"deliver_{min(p['rate_mbit'] for p in deliver['points']):g}mbit")
    main = main or next(iter(links.values()), None)
    doc["link"] = None if main is None else {
        "rate_mbit": main["rate_mbit_achieved_nstreams"], "rate_mbit_1stream": main["rate_mbit_achieved_1stream"],
        "rate_mbit_target": main["rate_mbit_target"], "rtt_ms": main["rtt_ms"], "rtt_ms_target": main["rtt_ms_target"],
        "loss": main["loss_observed"], "loss_target": main["loss_target"], "cc": main["cc"],
        "cc_mechanism": main["cc_mechanism"], "dropped_overrun": main["dropped_overrun"]}
    targets = {}
    for key, (op, bound, what) in TARGETS.items():
        value = doc.get(key)
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        targets[key] = {"value": value, "target": f"{op} {bound:g}", "met": met, "what": what}
    targets["e2e_delta_vs_ideal"] = _e2e_target(doc, e2e_doc)
    if deliver:
        full_s = deliver["full_s_lowest_rate"]
        targets["full_s_lowest_rate"] = {"value": full_s, "target": ">= 60", "met": full_s >= 60,
                                         "what": "full weights take at least 60 s at the lowest rate (sizing)"}
    doc["targets"] = targets


def _e2e_target(doc: dict[str, Any], e2e_doc: dict[str, Any] | None) -> dict[str, Any]:
    value, ci = doc.get("e2e_delta_vs_ideal"), doc.get("e2e_delta_vs_ideal_ci95")
    # part 5 not run: the full configuration's width (the target as the full benchmark judges it)
    width = e2e_doc["config"]["target_ci_half_width"] if e2e_doc else E2EConfig().target_ci_half_width
    met = None
    if value is not None and ci is not None:
        low, high = ci
        met = max(value - low, high - value) <= width * value and low >= E2E_LOW and high <= E2E_HIGH
    return {"value": value, "ci95": ci, "met": met,
            "target": f"95 % interval within ±{width * 100:g} % of the point, low >= {E2E_LOW:g}, "
                      f"high <= {E2E_HIGH:g}",
            "what": "delta run within 10 % of the ideal run, measured to ±3 % (not measurably faster than ideal)"}


def _plots(doc: dict[str, Any], out_dir: Path) -> list[str]:
    made = []
    try:
        if doc.get("deliver"):
            made.append(str(plots.deliver_plot(doc["deliver"], out_dir / "deliver_vs_rate.png")))
        if doc.get("streams"):
            made.append(str(plots.streams_plot(doc["streams"], out_dir / "streams.png")))
    except Exception as exc:  # plots are a convenience; the numbers are in the JSON
        doc["errors"]["plots"] = f"{type(exc).__name__}: {exc}"
    return made
