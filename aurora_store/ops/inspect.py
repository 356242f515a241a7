"""Data for the operators' notebooks: the delta history of a bucket and the run log, as plain structures.

Every function works on any bucket — one written by a whole run (history rows, snapshots, a run-log
export) or only by ``aurora diff`` (manifests alone) — and returns ``None`` or an empty structure when its
data is missing, never raises for that; the notebook then prints "no data". Tables are ``pyarrow``; the
rest are dataclasses, dicts and lists (no pandas).

Times from the run log are the Redis server clock (stream entry ids); manifest ``created_at`` is the
trainer's wall clock. Latencies across the two are therefore only as good as the clocks' agreement (on
one machine, or NTP-synced hosts: milliseconds).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aurora_store.codec.layout import ModelLayout
from aurora_store.config import DEMO_BUCKET, InspectSettings, find_demo_bucket
from aurora_store.errors import AuroraError, ConfigError
from aurora_store.ops import runlog
from aurora_store.ops.status import resolve_run
from aurora_store.store import history
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.versions import DeltaStore

BYTES_PER_ELEMENT = 2  # bf16 / fp16: what a full copy of the published weights costs

RunLog = list[dict[str, str]]


@dataclass(frozen=True)
class BucketView:
    """Everything the notebook shows, read once. ``run_log_source`` says where the run log came from
    (``None``: no run log was found)."""

    url: str
    store: DeltaStore
    versions: pa.Table
    snapshots: tuple[int, ...]
    layout: ModelLayout | None
    run_log: RunLog = field(default_factory=list)
    run_log_source: str | None = None

    @property
    def full_bytes(self) -> int | None:
        return self.layout.numel * BYTES_PER_ELEMENT if self.layout is not None else None


def open_view(bucket: str | None = None, *, redis: str | None = None, run: str | None = None,
              run_log_file: str | None = None, settings: InspectSettings | None = None) -> BucketView:
    """Open a bucket for inspection. What is not given comes from ``settings`` (default: the environment,
    :class:`~aurora_store.config.InspectSettings`): ``AURORA_BUCKET`` (else the demo's home bucket),
    ``AURORA_REDIS`` and ``AURORA_RUN`` for a live run log, ``AURORA_RUNLOG`` for a JSON-lines file. Without
    Redis the run log is read from the bucket's ``runlog/`` exports."""
    defaults = settings if settings is not None else InspectSettings.from_env()
    url = bucket or defaults.bucket
    if url is None:
        demo = find_demo_bucket()
        if demo is None:
            raise ConfigError(f"AURORA_BUCKET is not set and no demo bucket ({DEMO_BUCKET}) was found here or above: "
                              f"run `make demo` first, or point AURORA_BUCKET at a bucket")
        url = str(demo)
    store = DeltaStore(url)
    table = version_table(store)
    log, source = load_run_log(store, redis=redis or defaults.redis, run=run or defaults.run,
                               path=run_log_file or defaults.run_log_file)
    return BucketView(store.url, store, table, tuple(store.snapshot_versions()), bucket_layout(store),
                      log, source)


# --- the bucket ------------------------------------------------------------------------------------


def version_table(store: DeltaStore) -> pa.Table:
    """One row per version (the history schema, :data:`aurora_store.store.history.SCHEMA`): the Parquet history
    where it exists, completed from manifests for versions without a row (buckets written by
    ``aurora diff``, relays' regional buckets). Timings are null where only a manifest was available."""
    recorded = history.load(store)
    have = set(recorded.column("version").to_pylist())
    missing = [v for v in store.versions() if v not in have]
    if not missing:
        return recorded
    rows = recorded.to_pylist()
    for version in missing:
        try:
            rows.append(history.row_from_manifest(store.manifest(version)).as_dict())
        except AuroraError:  # an unreadable manifest is for `aurora verify` to report
            continue
    rows.sort(key=lambda r: r["version"])
    return pa.Table.from_pylist(rows, schema=history.SCHEMA)


def bucket_layout(store: DeltaStore) -> ModelLayout | None:
    """The model layout of the bucket: the run record's, else the newest manifest's, else a snapshot's."""
    candidates: list[str] = []
    info = store.run_info() or {}
    if info.get("layout"):
        candidates.append(str(info["layout"]))
    for version in store.versions()[-1:]:
        with contextlib.suppress(AuroraError):
            candidates.append(store.manifest(version).layout_fingerprint)
    for version in store.snapshot_versions()[-1:]:
        with contextlib.suppress(AuroraError):
            candidates.append(read_snapshot_manifest(store, version).layout_fingerprint)
    for fingerprint in candidates:
        try:
            return store.layout(fingerprint)
        except AuroraError:
            continue
    return None


def column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def timed_versions(table: pa.Table) -> pa.Table:
    """The rows that carry encode/upload/publish timings (written by a publisher with history on)."""
    if not table.num_rows:
        return table
    mask = [any(x is not None for x in xs) for xs in zip(*(column(table, c) for c in ("encode_s", "upload_s",
                                                                                        "publish_s")))]
    return table.filter(pa.array(mask, type=pa.bool_()))


@dataclass(frozen=True)
class ChangeMatrix:
    """``fractions[i][j]``: the fraction of row ``i``'s elements (a tensor, or a layer) changed by version
    ``versions[j]``."""

    rows: tuple[str, ...]
    versions: tuple[int, ...]
    fractions: np.ndarray  # float64 [len(rows), len(versions)]


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def change_matrix(table: pa.Table, layout: ModelLayout | None, *, by: str = "tensor") -> ChangeMatrix | None:
    """Changed fraction per tensor (``by="tensor"``, layout order) or per layer (``by="layer"``: the
    tensors of ``model.layers.N`` summed; tensors outside layers keep their own row) for every version."""
    if layout is None or not table.num_rows:
        return None
    if by not in ("tensor", "layer"):
        raise ValueError(f"by must be 'tensor' or 'layer', got {by!r}")
    group_of = {t.name: (_layer_label(t.name) if by == "layer" else t.name) for t in layout.tensors}
    groups = list(dict.fromkeys(group_of.values()))
    numel: Counter[str] = Counter()
    for t in layout.tensors:
        numel[group_of[t.name]] += t.numel
    versions = column(table, "version")
    fractions = np.zeros((len(groups), len(versions)))
    index = {g: i for i, g in enumerate(groups)}
    for j, changed in enumerate(column(table, "tensor_changed")):
        for name, count in (changed or []):
            group = group_of.get(name)
            if group is not None:
                fractions[index[group], j] += count
    fractions /= np.array([numel[g] for g in groups], dtype=np.float64)[:, None]
    return ChangeMatrix(tuple(groups), tuple(versions), fractions)


def _layer_label(name: str) -> str:
    match = _LAYER.search(name)
    return f"layer {int(match.group(1)):d}" if match else name.removesuffix(".weight")


def short_tensor_name(name: str) -> str:
    """``model.layers.3.self_attn.qkv_proj.weight`` → ``L3 self_attn.qkv_proj`` (for axis labels)."""
    match = _LAYER.search(name)
    name = name.removeprefix("model.").removesuffix(".weight")
    if match:
        return f"L{match.group(1)} " + name.split(f"layers.{match.group(1)}.", 1)[1]
    return name


# --- the run log -----------------------------------------------------------------------------------


def load_run_log(store: DeltaStore, *, redis: str | None = None, run: str | None = None,
                 path: str | None = None) -> tuple[RunLog, str | None]:
    """The run log and where it came from: Redis when a URL is given and reachable (``run`` defaults to the
    bucket's run record), else a JSON-lines file, else the bucket's ``runlog/`` exports; ``([], None)``
    when there is none."""
    if redis:
        name = run or (store.run_info() or {}).get("run")
        try:
            name = name or resolve_run(redis, None)
            entries = runlog.load_redis(redis, str(name))
            if entries:
                return entries, f"redis run {name}"
        except AuroraError:
            pass  # Redis is ephemeral: fall back to what was exported
    if path:
        return runlog.load_file(path), path
    entries = runlog.load_exported(store)
    return (entries, f"{store.url}/{runlog.PREFIX}") if entries else ([], None)


def events(log: RunLog, kind: str) -> RunLog:
    return [e for e in log if e.get("kind") == kind]


@dataclass(frozen=True)
class Latency:
    who: str  # the relay's region, or the actor
    version: int
    seconds: float


def _created_ms(table: pa.Table) -> dict[int, int]:
    out = {}
    for version, created in zip(column(table, "version"), column(table, "created_at")):
        if created:
            try:
                out[version] = int(dt.datetime.fromisoformat(created).timestamp() * 1000)
            except ValueError:
                continue
    return out


def latencies(log: RunLog, table: pa.Table, kind: str) -> list[Latency]:
    """Seconds from a version's manifest creation to each ``relay_forward`` (``who`` = region) or
    ``activate`` (``who`` = actor) event for it."""
    who_field = {"relay_forward": "region", "activate": "actor"}[kind]
    created = _created_ms(table)
    out = []
    for entry in events(log, kind):
        try:
            version = int(entry["version"])
        except (KeyError, ValueError):
            continue
        if version in created:
            seconds = (runlog.entry_millis(entry["id"]) - created[version]) / 1000
            out.append(Latency(entry.get(who_field, "?"), version, seconds))
    return out


def actor_timeline(log: RunLog) -> dict[str, list[tuple[float, int]]]:
    """Actor → ``(seconds since the first log entry, version)`` at bootstrap and at each activation."""
    if not log:
        return {}
    start = runlog.entry_millis(log[0]["id"])
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for entry in log:
        if entry.get("kind") in ("actor_bootstrap", "activate") and entry.get("version", "") != "":
            try:
                out[entry.get("actor", "?")].append(((runlog.entry_millis(entry["id"]) - start) / 1000,
                                                     int(entry["version"])))
            except ValueError:
                continue
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Settlements:
    """Rollout verdicts from ``settle`` events: per actor ``(accepted, rejected)``, and rejections by reason."""

    per_actor: Mapping[str, tuple[int, int]]
    reasons: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(a + r for a, r in self.per_actor.values())


def settlements(log: RunLog) -> Settlements:
    accepted: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for entry in events(log, "settle"):
        actor = entry.get("actor") or "(unknown)"
        if entry.get("accepted") == "1":
            accepted[actor] += 1
        else:
            rejected[actor] += 1
            reasons[entry.get("reason") or "(none)"] += 1
    actors = sorted(set(accepted) | set(rejected))
    return Settlements({a: (accepted[a], rejected[a]) for a in actors}, dict(reasons.most_common()))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, p90 and max (for the one-line summaries under each latency plot)."""
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90)), "max": float(arr.max())}
