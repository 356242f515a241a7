"""Per-component costs from our benchmarks' JSON (``python -m benchmarks … --json``) and from real runs.

Recognised documents (by their ``bench`` key, or their shape):

* ``codec`` — ``encode_gb_per_s`` (delta extraction, model GB/s), ``apply_gb_per_s`` (activation),
  ``bytes_per_changed`` and ``density`` (the workload);
* ``transfer`` — the best ``upload_mb_per_s`` over stream counts (trainer → bucket);
* ``wan`` — part 2 (``streams``): single-stream throughput under loss fits the Mathis constant; part 5
  (``e2e``): its ``ideal`` mode's per-step costs (generation makespan, training, publishing) and the delta size;
* ``run`` — a real run's trainer summary (``step_times``, ``delta_bytes``, ``full_bytes``) as written by
  ``workers.cluster`` (see :func:`from_run`).

Each source yields a :class:`Calibration`; several combine (later files win per field).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.errors import PlanError
from aurora_store.plan.config import Plan, validate


@dataclass(frozen=True)
class Calibration:
    costs: Mapping[str, float] = field(default_factory=dict)  # Costs fields
    plan: Mapping[str, Any] = field(default_factory=dict)  # Plan fields (workload measured in a run)
    makespan_s: float | None = None  # measured generation per step (dispatch → last result), if known
    sources: tuple[str, ...] = ()

    def merge(self, other: Calibration) -> Calibration:
        return Calibration({**self.costs, **other.costs}, {**self.plan, **other.plan},
                           other.makespan_s if other.makespan_s is not None else self.makespan_s,
                           self.sources + other.sources)


def _median(values: Sequence[float]) -> float | None:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(values) if values else None


def expected_max_normal(n: int) -> float:
    """E[max of n standard normal draws] (Blom's approximation)."""
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def from_codec(doc: Mapping[str, Any]) -> Calibration:
    costs = {k: float(doc[k]) for k in ("encode_gb_per_s", "apply_gb_per_s") if doc.get(k)}
    plan = {"bytes_per_changed": float(doc["bytes_per_changed"])} if doc.get("bytes_per_changed") else {}
    if doc.get("density"):
        plan["density"] = float(doc["density"])
    return Calibration(costs, plan, sources=("codec",))


def from_transfer(doc: Mapping[str, Any]) -> Calibration:
    rates = [v.get("upload_mb_per_s") for v in (doc.get("results") or doc.get("s3") or {}).values()
             if isinstance(v, Mapping)]
    best = max((r for r in rates if r), default=None)
    return Calibration({"upload_mb_per_s": float(best)} if best else {}, sources=("transfer",))


def mathis_constant(throughput_bytes_s: float, rtt_ms: float, loss: float, mss: int = 1448) -> float:
    """The constant C in ``rate = C · MSS / (RTT · √p)`` that reproduces a measured single-stream rate."""
    return throughput_bytes_s * (rtt_ms / 1000) * math.sqrt(loss) / mss


def from_wan(doc: Mapping[str, Any]) -> Calibration:
    cal = Calibration(sources=("wan",))
    streams = doc.get("streams")
    if isinstance(streams, Mapping) and streams.get("points"):
        nbytes = float(streams.get("delta_bytes") or doc.get("model", {}).get("delta_bytes") or 0)
        constants = []
        for point in streams["points"]:
            one = point.get("by_streams", {}).get("1", {})
            seconds = one.get("median")
            if nbytes and seconds and point.get("loss"):
                constants.append(mathis_constant(nbytes / seconds, float(streams["rtt_ms"]), float(point["loss"])))
        if constants:
            cal = cal.merge(Calibration({"mathis_c": statistics.median(constants)}))
    e2e = doc.get("e2e")
    if isinstance(e2e, Mapping) and isinstance(e2e.get("modes"), Mapping) and "ideal" in e2e["modes"]:
        ideal = e2e["modes"]["ideal"]
        skip = int((e2e.get("config") or {}).get("skip_steps", 2))
        intervals = {skip + 1 + i: s for i, s in enumerate(ideal.get("step_intervals_s") or [])}
        cal = cal.merge(from_run(ideal, intervals))
    return cal


def from_run(summary: Mapping[str, Any], intervals: Mapping[int, float] | None = None) -> Calibration:
    """A real run's component costs: the trainer's serial time per step, publishing time, generation makespan,
    and the delta size (as density × bytes per changed element of the planned model).

    ``summary`` is the trainer's (``step_times``: per step ``wait_s``, ``train_s``, ``publish_s``,
    ``makespan_s``). With the measured step ``intervals`` (step → seconds since the previous step record), the
    trainer's serial time counts everything it does between collecting one batch and waiting for the next
    except publishing (dispatch, rewards, training, its checkpoint): ``interval − wait − publish``. Without
    them it is the training time alone.
    """
    times = summary.get("step_times") or []
    if not times:
        raise PlanError("run summary has no step_times to calibrate from")
    train = _median([t.get("train_s") for t in times[1:]] or [t.get("train_s") for t in times])
    if intervals:
        serial = [seconds - (times[step - 1].get("wait_s") or 0.0) - (times[step - 1].get("publish_s") or 0.0)
                  for step, seconds in intervals.items() if 1 <= step <= len(times)]
        train = _median(serial) if serial else train
    publish = _median([t.get("publish_s") for t in times[1:]] or [t.get("publish_s") for t in times])
    makespan = _median([t.get("makespan_s") for t in times[2:]] or [t.get("makespan_s") for t in times])
    full = summary.get("full_bytes")
    costs: dict[str, float] = {}
    plan: dict[str, Any] = {}
    if train is not None:
        plan["train_s"] = train
    if publish and full:  # publishing scans the whole model: its rate in model GB/s
        costs["encode_gb_per_s"] = float(full) / publish / 1e9
    deltas = _median(summary.get("delta_bytes") or [])
    if deltas and full:
        plan["delta_fraction"] = float(deltas) / float(full)
    return Calibration(costs, plan, makespan, sources=("run",))


def read(paths: Sequence[str | Path]) -> Calibration:
    cal = Calibration()
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise PlanError(f"calibration file {path}: {exc}") from None
        if not isinstance(doc, Mapping):
            raise PlanError(f"calibration file {path}: not a JSON object")
        kind = doc.get("bench") or doc.get("benchmark")
        if kind == "codec":
            part = from_codec(doc)
        elif kind == "transfer":
            part = from_transfer(doc)
        elif kind == "wan":
            part = from_wan(doc)
        elif "step_times" in doc:
            part = from_run(doc)
        else:
            raise PlanError(f"calibration file {path}: not a codec/transfer/wan benchmark or a run summary")
        cal = cal.merge(dataclasses.replace(part, sources=tuple(f"{s}:{path}" for s in part.sources)))
    return cal


def apply(plan: Plan, cal: Calibration) -> Plan:
    """``plan`` with the calibrated costs and workload.

    A measured generation makespan fixes ``tokens_per_rollout`` (what the planned actors would need to generate
    per prompt to take that long); a measured delta size fixes the density for the planned bytes per element.
    """
    measured: dict[str, Any] = {k: v for k, v in cal.costs.items() if v and v > 0}
    costs = dataclasses.replace(plan.costs, **measured)
    changes: dict[str, Any] = {k: v for k, v in cal.plan.items() if k in ("train_s", "density", "bytes_per_changed")}
    if "delta_fraction" in cal.plan:
        changes["density"] = min(1.0, cal.plan["delta_fraction"] * 2 / changes.get("bytes_per_changed",
                                                                                  plan.bytes_per_changed))
    if cal.makespan_s is not None:
        rate = sum(r.actors * r.tokens_per_s for r in plan.regions)
        # the makespan also holds what the simulation adds itself: lease and result trips, activation
        rtt = max(r.rtt_ms for r in plan.regions if r.actors) / 1000
        activate = plan.full_bytes / (costs.apply_gb_per_s * 1e9)
        gen = max(cal.makespan_s - costs.control_s - rtt - activate, 1e-3)
        # a makespan is the slowest share's: the simulation draws each share's time around the mean
        gen /= 1 + costs.gen_cv * expected_max_normal(sum(r.actors for r in plan.regions))
        changes["tokens_per_rollout"] = gen * rate / plan.batch_size
    return validate(dataclasses.replace(plan, costs=costs, **changes))
