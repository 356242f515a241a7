"""A plan's report: the simulated step time against the zero-transfer ideal and against full broadcast, WAN
bytes and egress cost per day, actor idle time, the cost of a preemption, and what limits the step."""

from __future__ import annotations

import math
import statistics
from typing import Any

from aurora_store.plan.config import Plan
from aurora_store.plan.sim import SimResult, Simulation, simulate, wan_rate
from aurora_store.sched import LeasePolicy

DAY_S = 86400.0


def _round(x: float, digits: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def wan_bytes_per_step(plan: Plan, step_s: float) -> dict[str, float]:
    """Bytes each remote region's link carries per step: the delta once (relay) or once per actor, the periodic
    snapshot (relay), and the catch-ups of preempted spot actors (which cross the link without a relay)."""
    sim = Simulation(plan)
    out = {}
    for region in plan.regions:
        if region.name == plan.home:
            continue
        copies = 1 if region.relay else region.actors
        nbytes = plan.delta_bytes * copies
        if region.relay:
            nbytes += plan.full_bytes / plan.snapshot_every
        if region.spot and plan.preempt_per_hour > 0:
            preemptions_per_step = region.actors * plan.preempt_per_hour * step_s / 3600
            nbytes += preemptions_per_step * sim.catch_up(region)["wan_bytes"]
        out[region.name] = nbytes
    return out


def _steady(result: SimResult) -> list:
    return [s for s in result.steps[2:] if s.recorded_s is not None] or result.steps


def limits(plan: Plan, delta: SimResult, ideal: SimResult) -> dict[str, Any]:
    """The candidate bottlenecks of one step, in seconds, and which one binds."""
    rate = sum(r.actors * r.tokens_per_s for r in plan.regions)
    generation = plan.batch_size * plan.tokens_per_rollout / rate
    encode = plan.full_bytes / (plan.costs.encode_gb_per_s * 1e9)
    candidates = {"generation": generation, "train+encode": plan.train_s + encode}
    steady = _steady(delta)
    for region in plan.regions:
        if region.name == plan.home or not region.actors:
            continue
        waits = [s.staged_s[region.name] - s.train_end_s for s in steady
                 if region.name in s.staged_s and s.train_end_s is not None]
        if waits:  # from the end of training until the region's last actor has D_v staged
            candidates[f"train+delivery to {region.name}"] = plan.train_s + statistics.median(waits)
    binding = max(candidates, key=candidates.__getitem__)
    excluded = statistics.fmean([s.excluded for s in steady]) if steady else 0.0
    return {"seconds": {k: round(v, 3) for k, v in candidates.items()}, "binding": binding,
            "excluded_actors_per_step": round(excluded, 2),
            "gap_to_ideal": _round(delta.step_s / ideal.step_s - 1)}


def catch_up_cost(plan: Plan, step_s: float, lease_s: float | None = None) -> dict[str, Any]:
    """Per region: what a replacement's catch-up costs, and how long a preempted actor's leases hold its prompts
    (``lease_s``: the simulated run's; by default the lease policy's once a share's completion is measured)."""
    sim = Simulation(plan)
    if lease_s is None:
        leases = LeasePolicy(factor=plan.lease_factor)
        leases.observe(int(1000 * plan.batch_size * plan.tokens_per_rollout
                           / sum(r.actors * r.tokens_per_s for r in plan.regions)))
        lease_s = leases.duration_ms() / 1000
    per_region = {}
    for region in plan.regions:
        if not region.actors:
            continue
        c = sim.catch_up(region)
        per_region[region.name] = {
            "seconds": _round(c["seconds"], 2), "bytes": int(c["bytes"]), "wan_bytes": int(c["wan_bytes"]),
            "deltas_replayed": c["deltas_replayed"],
            "steps_missed": _round((plan.replace_s + c["seconds"]) / step_s, 2),
            "lease_expiry_s": _round(lease_s, 2)}
    return per_region


def build(plan: Plan, *, timeline: bool = True) -> dict[str, Any]:
    delta = simulate(plan, mode="delta")
    ideal = simulate(plan, mode="ideal")
    full_1 = simulate(plan, mode="full", streams=1)
    full_s = simulate(plan, mode="full", streams=plan.streams)
    per_step = wan_bytes_per_step(plan, delta.step_s)
    steps_per_day = DAY_S / delta.step_s
    per_day = {r: b * steps_per_day for r, b in per_step.items()}
    prices = {r.name: r.egress_usd_per_gb for r in plan.regions}
    doc: dict[str, Any] = {
        "plan": plan.name, "model_parameters": plan.model.parameters, "full_bytes": plan.full_bytes,
        "delta_bytes": int(plan.delta_bytes), "actors": plan.actors, "streams": plan.streams,
        "step_s": _round(delta.step_s, 3), "ideal_step_s": _round(ideal.step_s, 3),
        "full_broadcast_step_s": {"1": _round(full_1.step_s, 3), str(plan.streams): _round(full_s.step_s, 3)},
        "delta_vs_ideal": _round(delta.step_s / ideal.step_s),
        "full_vs_delta": {"1": _round(full_1.step_s / delta.step_s),
                          str(plan.streams): _round(full_s.step_s / delta.step_s)},
        "tokens_per_s": _round(plan.batch_size * plan.tokens_per_rollout / delta.step_s, 1),
        "steps_per_day": _round(steps_per_day, 1),
        "wan_bytes_per_step": {r: int(b) for r, b in per_step.items()},
        "wan_bytes_per_day": {r: int(b) for r, b in per_day.items()},
        "egress_usd_per_day": {r: _round(b / 1e9 * prices[r], 2) for r, b in per_day.items()},
        "egress_usd_per_day_total": _round(sum(b / 1e9 * prices[r] for r, b in per_day.items()), 2),
        "full_broadcast_wan_bytes_per_day": {
            r: int(plan.full_bytes * (1 if plan.region(r).relay else plan.region(r).actors) * DAY_S / full_s.step_s)
            for r in per_step},
        "idle_fraction": _round(delta.idle_fraction), "ideal_idle_fraction": _round(ideal.idle_fraction),
        "preemptions": delta.preemptions,
        "catch_up": catch_up_cost(plan, delta.step_s, statistics.median(s.lease_s for s in _steady(delta))),
        "link_rate_mbit": {r.name: _round(wan_rate(r, plan, plan.streams) * 8 / 1e6, 1)
                           for r in plan.regions if r.name != plan.home},
        "single_stream_rate_mbit": {r.name: _round(wan_rate(r, plan, 1) * 8 / 1e6, 1)
                                    for r in plan.regions if r.name != plan.home},
        "limits": limits(plan, delta, ideal),
    }
    if timeline:
        doc["timeline"] = delta.timeline()
    return doc


def text(doc: dict[str, Any]) -> str:
    """The human-readable form: per-step timeline, then the summary."""
    lines = []
    if doc.get("timeline"):
        lines.append(f"{'step':>4} {'ver':>4} {'dispatch':>9} {'collect':>9} {'trained':>9} {'published':>9} "
                     f"{'elig':>5} {'excl':>5}  staged (per region)")
        for s in doc["timeline"]:
            staged = " ".join(f"{r}={t:.1f}" for r, t in s["staged_s"].items())
            lines.append(f"{s['step']:>4} {s['version']:>4} {s['dispatched_s']:>9.2f} {s['collected_s']:>9.2f} "
                         f"{s['train_end_s'] or 0:>9.2f} {s['published_s'] or 0:>9.2f} {s['eligible']:>5} "
                         f"{s['excluded']:>5}  {staged}")
        lines.append("")
    full = ", ".join(f"{k} stream(s) {v:.2f} s" for k, v in doc["full_broadcast_step_s"].items())
    lines += [
        f"model: {doc['model_parameters'] / 1e9:.2f} B parameters, full {doc['full_bytes'] / 1e9:.2f} GB, "
        f"delta {doc['delta_bytes'] / 1e6:.1f} MB per step; {doc['actors']} actors",
        f"step: {doc['step_s']:.2f} s   ideal (no transfer cost): {doc['ideal_step_s']:.2f} s   "
        f"(+{100 * (doc['delta_vs_ideal'] - 1):.1f} %)",
        f"full broadcast every step: {full}",
        f"throughput: {doc['tokens_per_s']:.0f} tokens/s, {doc['steps_per_day']:.0f} steps/day; "
        f"actor idle fraction {doc['idle_fraction']:.1%} (ideal {doc['ideal_idle_fraction']:.1%})",
    ]
    for region, nbytes in doc["wan_bytes_per_day"].items():
        lines.append(f"WAN into {region}: {nbytes / 1e9:.1f} GB/day (full broadcast: "
                     f"{doc['full_broadcast_wan_bytes_per_day'][region] / 1e9:.0f} GB/day), egress "
                     f"${doc['egress_usd_per_day'][region]:.2f}/day; link {doc['link_rate_mbit'][region]} Mbit/s "
                     f"with {doc['streams']} streams, {doc['single_stream_rate_mbit'][region]} with one")
    for region, c in doc["catch_up"].items():
        lines.append(f"preemption in {region}: leases expire after {c['lease_expiry_s']} s; the replacement "
                     f"catches up in {c['seconds']} s ({c['bytes'] / 1e9:.2f} GB, {c['wan_bytes'] / 1e9:.2f} GB "
                     f"over the WAN), ~{c['steps_missed']} steps missed")
    lim = doc["limits"]
    lines.append("limits: " + ", ".join(f"{k} {v:.2f} s" for k, v in lim["seconds"].items())
                 + f" → bound by {lim['binding']}; {lim['excluded_actors_per_step']} actors excluded per step")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> None:
    """The timeline as bars per step: generation, training, publishing, delivery into each region."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = doc["timeline"]
    regions = sorted({r for s in steps for r in s["staged_s"]})
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(steps) + 1.5))
    colors = {"generate": "#4c72b0", "train": "#dd8452", "publish": "#55a868"}
    palette = ["#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]
    for s in steps:
        y = s["step"]
        ax.barh(y, s["collected_s"] - s["dispatched_s"], left=s["dispatched_s"], height=0.35,
                color=colors["generate"], label="generate B_k" if y == 1 else None)
        if s["train_end_s"] is not None:
            ax.barh(y + 0.35, s["train_end_s"] - s["collected_s"], left=s["collected_s"], height=0.3,
                    color=colors["train"], label="train" if y == 1 else None)
            if s["published_s"] is not None:
                ax.barh(y + 0.35, s["published_s"] - s["train_end_s"], left=s["train_end_s"], height=0.3,
                        color=colors["publish"], label="encode+publish D_k" if y == 1 else None)
            for i, r in enumerate(regions):
                if r in s["staged_s"]:
                    ax.plot([s["train_end_s"], s["staged_s"][r]], [y - 0.3 - 0.08 * i] * 2,
                            color=palette[i % len(palette)], lw=2, label=f"D_k staged in {r}" if y == 1 else None)
    ax.set_xlabel("seconds")
    ax.set_ylabel("step")
    ax.invert_yaxis()
    ax.set_title(f"{doc.get('plan') or 'plan'}: step {doc['step_s']:.2f} s, ideal {doc['ideal_step_s']:.2f} s")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
