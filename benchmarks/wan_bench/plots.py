"""PNG plots of parts 1 and 2 (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def deliver_plot(deliver: dict[str, Any], path: Path) -> Path:
    """Time to deliver one version vs link rate: full weights vs delta (the shape of the paper's Fig. 14)."""
    plt = _pyplot()
    points = sorted(deliver["points"], key=lambda p: p["rate_mbit"])
    rates = [p["rate_mbit"] for p in points]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(rates, [p["full_s"] for p in points], "o-", label=f"full weights ({points[0]['full_bytes'] / 1e6:.0f} MB)")
    ax.plot(rates, [p["delta_s"] for p in points], "s-", label=f"delta ({points[0]['delta_bytes'] / 1e6:.1f} MB)")
    for p in points:
        ax.annotate(f"{p['speedup']:.0f}×", (p["rate_mbit"], p["delta_s"]), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(rates)
    ax.set_xticklabels([f"{r:g}" for r in rates])
    ax.set_xlabel("emulated link rate (Mbit/s)")
    ax.set_ylabel("time to deliver one version (s)")
    ax.set_title(f"Deliver + verify one version, RTT {deliver['rtt_ms']:g} ms, cubic")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def streams_plot(streams: dict[str, Any], path: Path) -> Path:
    """Delta delivery time vs parallel streams, one line per loss rate (median, min–max bars)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for point in streams["points"]:
        counts = sorted(int(s) for s in point["by_streams"])
        stats = [point["by_streams"][str(s)] for s in counts]
        med = [s["median"] for s in stats]
        err = [[m - s["min"] for m, s in zip(med, stats)], [s["max"] - m for m, s in zip(med, stats)]]
        ax.errorbar(counts, med, yerr=err, marker="o", capsize=3, label=f"loss {point['loss'] * 100:g} %")
    ax.set_xscale("log", base=2)
    counts = sorted({int(s) for p in streams["points"] for s in p["by_streams"]})
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts])
    ax.set_xlabel("parallel streams")
    ax.set_ylabel("time to deliver the delta (s)")
    ax.set_title(f"{streams['delta_bytes'] / 1e6:.1f} MB delta in {streams['segments']} segments, "
                 f"{streams['rate_mbit']:g} Mbit/s, RTT {streams['rtt_ms']:g} ms")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
