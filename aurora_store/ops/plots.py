"""Drawing the notebook's plots, each onto a matplotlib ``Axes`` the caller owns.

Nothing here creates figures or touches pyplot's global state, so the functions work the same in a
notebook, a script writing PNGs, or a test; :mod:`aurora_store.ops.notebook` lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, PercentFormatter

from aurora_store.ops.inspect import ChangeMatrix, Latency, Settlements, column, short_tensor_name
from aurora_store.textfmt import human_bytes

MAX_LABELLED_ROWS = 48
MAX_LABELLED_COLUMNS = 30


def bytes_per_version(ax: Axes, table: pa.Table, full_bytes: int | None) -> None:
    """Download size of each version (segments + manifest) against one full copy of the weights."""
    versions = column(table, "version")
    sizes = [d + m for d, m in zip(column(table, "delta_bytes"), column(table, "manifest_bytes"))]
    ax.bar(versions, sizes, color="tab:blue", label="delta (segments + manifest)")
    if full_bytes:
        ax.axhline(full_bytes, color="tab:red", linestyle="--", label=f"full model ({human_bytes(full_bytes)})")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: human_bytes(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    _versions_on_x(ax)
    ax.set_ylabel("bytes")
    ax.set_title("bytes per version")
    ax.legend(loc="best")


def density(ax: Axes, table: pa.Table) -> None:
    """Fraction of all elements each version changed."""
    ax.plot(column(table, "version"), column(table, "density"), marker="o", markersize=3)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    _versions_on_x(ax)
    ax.set_ylabel("changed elements")
    ax.set_title("density per version")


def change_heatmap(ax: Axes, matrix: ChangeMatrix, title: str = "changed fraction per tensor") -> None:
    """Rows (tensors or layers) × versions, coloured by the fraction of the row's elements changed."""
    image = ax.imshow(matrix.fractions, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0)
    rows, cols = len(matrix.rows), len(matrix.versions)
    step = max(1, -(-rows // MAX_LABELLED_ROWS))
    ax.set_yticks(range(0, rows, step))
    ax.set_yticklabels([short_tensor_name(r) for r in matrix.rows[::step]], fontsize=7)
    step = max(1, -(-cols // MAX_LABELLED_COLUMNS))  # columns are versions in order, gaps or not
    ax.set_xticks(range(0, cols, step))
    ax.set_xticklabels([str(v) for v in matrix.versions[::step]], fontsize=7)
    ax.set_xlabel("version")
    ax.set_title(title)
    ax.figure.colorbar(image, ax=ax, format=PercentFormatter(1.0), label="changed")


def publish_timings(ax: Axes, table: pa.Table) -> None:
    """Encode, upload and whole-publish seconds per version (from the Parquet history)."""
    versions = column(table, "version")
    for name, label in (("encode_s", "encode"), ("upload_s", "upload"), ("publish_s", "publish (total)")):
        values = [np.nan if v is None else v for v in column(table, name)]
        ax.plot(versions, values, marker="o", markersize=3, label=label)
    _versions_on_x(ax)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_title("publish latency")
    ax.legend(loc="best")


def latencies(ax: Axes, points: Sequence[Latency], title: str) -> None:
    """One line per relay or actor: seconds from a version's manifest to the event, per version."""
    by_who: dict[str, list[Latency]] = {}
    for point in points:
        by_who.setdefault(point.who, []).append(point)
    for who, series in sorted(by_who.items()):
        series.sort(key=lambda p: p.version)
        ax.plot([p.version for p in series], [p.seconds for p in series], marker="o", markersize=3, label=who)
    _versions_on_x(ax)
    ax.set_ylabel("seconds after the manifest")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)


def actor_versions(ax: Axes, timeline: Mapping[str, Sequence[tuple[float, int]]]) -> None:
    """Each actor's active version over time (a step line from bootstrap through every activation)."""
    for actor, points in timeline.items():
        ax.step([t for t, _ in points], [v for _, v in points], where="post", marker="o", markersize=3,
                label=actor)
    ax.set_xlabel("seconds since the run log starts")
    ax.set_ylabel("active version")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("actors' versions over time")
    ax.legend(loc="best", fontsize=8)


def settlements(ax: Axes, counts: Settlements) -> None:
    """Accepted and rejected rollouts per actor (stacked)."""
    actors = list(counts.per_actor)
    accepted = [counts.per_actor[a][0] for a in actors]
    rejected = [counts.per_actor[a][1] for a in actors]
    ax.bar(actors, accepted, color="tab:green", label="accepted")
    ax.bar(actors, rejected, bottom=accepted, color="tab:red", label="rejected")
    ax.set_ylabel("rollouts")
    ax.set_title("accepted vs rejected rollouts")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(loc="best")


def rejection_reasons(ax: Axes, counts: Settlements) -> None:
    """Rejected rollouts by the reason the trainer gave."""
    if not counts.reasons:
        ax.text(0.5, 0.5, "no rejections", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    reasons = list(counts.reasons)
    ax.barh(reasons, [counts.reasons[r] for r in reasons], color="tab:red")
    ax.set_xlabel("rollouts")
    ax.set_title("rejections by reason")


def _versions_on_x(ax: Axes) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("version")
