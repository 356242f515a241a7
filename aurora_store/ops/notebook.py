"""The sections of ``notebooks/delta_history.ipynb``, one call per cell.

Each ``show_*`` function prints a short "no data: …" line when the bucket or run log lacks what it
needs, and otherwise draws its figure and displays it as a PNG. Figures are drawn with matplotlib's Agg
canvas directly (no pyplot, no GUI backend), so the notebook renders identically headless, in CI and in
Jupyter, and every cell's output is an image rather than a figure object's repr.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from aurora_store.ops import inspect, plots
from aurora_store.ops.inspect import BucketView
from aurora_store.textfmt import human_bytes, table

NO_RUN_LOG = ("no run log (set AURORA_REDIS for a live run, or export one into the bucket with "
              "aurora_store.ops.runlog.export_run_log)")


def no_data(reason: str) -> None:
    print(f"no data: {reason}")


def figure(width: float = 9.0, height: float = 4.0, *, cols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, cols, i + 1) for i in range(cols)]
    return fig, axes


def display_figure(fig: Figure, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG and show it when running under IPython; returns the PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    png = buffer.getvalue()
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return png
    if get_ipython() is not None:
        display(Image(data=png, format="png"))
    return png


def show_summary(view: BucketView) -> None:
    versions = inspect.column(view.versions, "version")
    span = f"{versions[0]}…{versions[-1]}" if versions else "none"
    print(f"bucket:     {view.url}")
    print(f"versions:   {len(versions)} ({span})")
    print(f"snapshots:  {', '.join(map(str, view.snapshots)) or 'none'}")
    print(f"full model: {human_bytes(view.full_bytes) if view.full_bytes else 'unknown (no layout)'}")
    print(f"run log:    {f'{len(view.run_log)} entries from {view.run_log_source}' if view.run_log else 'none'}")


def show_versions(view: BucketView, *, limit: int = 40) -> None:
    rows = view.versions.to_pylist()
    if not rows:
        return no_data("no published versions")
    shown = rows if len(rows) <= limit else rows[: limit // 2] + rows[-limit // 2:]
    cells = [{"version": r["version"], "base": r["base_version"], "segments": r["segments"],
                "bytes": human_bytes(r["delta_bytes"] + r["manifest_bytes"]), "changed": r["changed"],
                "density": f"{100 * r['density']:.3f}%", "encode_s": r["encode_s"], "upload_s": r["upload_s"],
                "publish_s": r["publish_s"], "created": (r["created_at"] or "")[:19]} for r in shown]
    print(table(cells, list(cells[0])))
    if len(rows) > limit:
        print(f"({len(rows) - len(shown)} versions in the middle not shown)")


def show_sizes(view: BucketView) -> None:
    if not view.versions.num_rows:
        return no_data("no published versions")
    fig, (ax,) = figure()
    plots.bytes_per_version(ax, view.versions, view.full_bytes)
    display_figure(fig)


def show_density(view: BucketView) -> None:
    if not view.versions.num_rows:
        return no_data("no published versions")
    fig, (ax,) = figure()
    plots.density(ax, view.versions)
    display_figure(fig)


def show_tensor_changes(view: BucketView) -> None:
    if view.layout is None:
        return no_data("the bucket stores no layout for its versions")
    by_tensor = inspect.change_matrix(view.versions, view.layout, by="tensor")
    by_layer = inspect.change_matrix(view.versions, view.layout, by="layer")
    if by_tensor is None or by_layer is None:
        return no_data("no published versions")
    fig, (left, right) = figure(13, max(4.0, 0.16 * len(by_tensor.rows) + 1.5), cols=2)
    plots.change_heatmap(left, by_tensor)
    plots.change_heatmap(right, by_layer, "changed fraction per layer")
    display_figure(fig)


def show_publish_latency(view: BucketView) -> None:
    timed = inspect.timed_versions(view.versions)
    if not timed.num_rows:
        return no_data("no history rows with timings (the bucket was not written by a publisher that records "
                       "history, e.g. only by `aurora diff`)")
    fig, (ax,) = figure()
    plots.publish_timings(ax, timed)
    display_figure(fig)


def show_delivery_latency(view: BucketView) -> None:
    if not view.run_log:
        return no_data(NO_RUN_LOG)
    forwards = inspect.latencies(view.run_log, view.versions, "relay_forward")
    activations = inspect.latencies(view.run_log, view.versions, "activate")
    if not forwards and not activations:
        return no_data("the run log has no relay_forward or activate events for versions in this bucket")
    fig, axes = figure(13, 4, cols=2)
    for ax, points, title in ((axes[0], forwards, "relay forward latency"),
                              (axes[1], activations, "activation latency")):
        if points:
            plots.latencies(ax, points, title)
            stats = inspect.summarize([p.seconds for p in points])
            print(f"{title}: median {stats['median']:.3f}s, p90 {stats['p90']:.3f}s, max {stats['max']:.3f}s "
                  f"over {len(points)} events")
        else:
            ax.text(0.5, 0.5, f"no data: {title}", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
    display_figure(fig)


def show_actor_versions(view: BucketView) -> None:
    if not view.run_log:
        return no_data(NO_RUN_LOG)
    timeline = inspect.actor_timeline(view.run_log)
    if not timeline:
        return no_data("the run log has no actor_bootstrap or activate events")
    fig, (ax,) = figure()
    plots.actor_versions(ax, timeline)
    display_figure(fig)


def show_settlements(view: BucketView) -> None:
    if not view.run_log:
        return no_data(NO_RUN_LOG)
    counts = inspect.settlements(view.run_log)
    if not counts.total:
        return no_data("the run log has no settle events")
    accepted = sum(a for a, _ in counts.per_actor.values())
    print(f"{accepted} of {counts.total} rollouts accepted ({100 * accepted / counts.total:.1f}%)")
    fig, (left, right) = figure(13, 4, cols=2)
    plots.settlements(left, counts)
    plots.rejection_reasons(right, counts)
    display_figure(fig)
