"""What a plan simulates: the deployment (regions, actors, links), the workload and per-component costs.

Read from a TOML or YAML file (or built in code); command-line flags override single fields. Every value is
checked here, once: a bad plan raises :class:`PlanError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.errors import PlanError
from aurora_store.plan.models import Shapes, resolve

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Region:
    """A region: its actors, and its link to the home region (where the trainer and the home bucket are)."""

    name: str
    actors: int = 0
    tokens_per_s: float = 1000.0  # per actor, generation throughput
    link_mbit: float = math.inf  # bottleneck rate to home (the home region itself: unlimited)
    rtt_ms: float = 0.0
    loss: float = 0.0  # random packet loss on the path (limits each TCP stream, see Costs.stream_mbit)
    relay: bool = True  # a relay copies each object across once; without one every actor pulls across the WAN
    spot: bool = False  # actors are preemptible (Plan.preempt_per_hour applies)
    egress_usd_per_gb: float = 0.0  # price of bytes sent from home into this region
    local_gbit: float = 10.0  # regional bucket → one actor


@dataclass(frozen=True)
class Costs:
    """Per-component costs; defaults are rough, ``aurora plan --calibrate`` replaces them with measurements."""

    encode_gb_per_s: float = 2.0  # trainer: model GB scanned + encoded per second (delta extraction)
    apply_gb_per_s: float = 20.0  # actor: activation, model GB per second (in-place scatter of a delta)
    decode_mb_per_s: float = 400.0  # actor: staging (verify + decode) of delta bytes
    load_gb_per_s: float = 2.0  # actor: loading full weights (full broadcast, snapshot catch-up)
    upload_mb_per_s: float = 1000.0  # trainer → home bucket
    # One TCP stream under loss p at RTT r reaches about mathis_c · MSS / (r · √p) (Mathis et al.); calibrated
    # from the WAN benchmark's per-stream throughput under loss.
    mathis_c: float = 1.22
    mss_bytes: int = 1448
    stream_efficiency: float = 0.95  # share of the link rate one loss-free stream achieves (headers, slow start)
    control_s: float = 0.05  # per step: dispatch, commit and result round trips on the control plane (+ RTT)
    heartbeat_s: float = 1.0  # actors report "staged" with their next heartbeat: on average half of this
    # An actor that finds no work re-measures its capacity (one generation batch) if its last measurement is
    # older than recalibrate_idle_s; leases arriving meanwhile wait. 0 = measurements cost nothing.
    calibrate_s: float = 0.0
    recalibrate_idle_s: float = 5.0
    work_poll_s: float = 0.2  # an idle actor first waits this long for leases (a blocking read) before measuring
    # Generation time of one actor's share varies from step to step (sampled lengths): its coefficient of
    # variation. It decides who waits for whom, and so who sits idle.
    gen_cv: float = 0.1


@dataclass(frozen=True)
class Plan:
    model: Shapes
    regions: tuple[Region, ...]
    home: str
    batch_size: int = 512  # prompts per step
    tokens_per_rollout: float = 4096.0  # tokens generated per prompt (all samples of its group)
    train_s: float = 30.0  # trainer time per step (forward/backward/optimizer)
    density: float = 0.01  # changed elements per step
    bytes_per_changed: float = 2.9
    streams: int = 4
    segment_mb: float = 16.0
    cut_through: bool = True
    snapshot_every: int = 50
    preempt_per_hour: float = 0.0  # per spot actor
    replace_s: float = 120.0  # a preempted actor's replacement is up after this long
    lease_factor: float = 2.5  # lease = factor × median completion (the trainer's --lease-factor)
    initial_lease_s: float = 60.0  # the lease before any completion is measured (--initial-lease-s)
    split: str = "proportional"  # the trainer's --split: by measured throughput, or "uniform"
    steps: int = 30
    seed: int = 0
    costs: Costs = field(default_factory=Costs)
    name: str = ""

    @property
    def full_bytes(self) -> int:
        return self.model.bf16_bytes

    @property
    def delta_bytes(self) -> float:
        return self.model.parameters * self.density * self.bytes_per_changed

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise PlanError(f"no region {name!r}")

    @property
    def actors(self) -> int:
        return sum(r.actors for r in self.regions)


def _positive(name: str, value: float, *, zero_ok: bool = False) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0 or (value == 0 and not zero_ok):
        raise PlanError(f"{name} must be {'non-negative' if zero_ok else 'positive'}, got {value!r}")


def validate(plan: Plan) -> Plan:
    if not plan.regions:
        raise PlanError("a plan needs at least one region")
    names = [r.name for r in plan.regions]
    if len(set(names)) != len(names):
        raise PlanError(f"region names repeat: {names}")
    if plan.home not in names:
        raise PlanError(f"home region {plan.home!r} is not among the regions {names}")
    if plan.actors < 1:
        raise PlanError("a plan needs at least one actor")
    for r in plan.regions:
        _positive(f"{r.name}.actors", r.actors, zero_ok=True)
        _positive(f"{r.name}.tokens_per_s", r.tokens_per_s)
        _positive(f"{r.name}.link_mbit", r.link_mbit)
        _positive(f"{r.name}.rtt_ms", r.rtt_ms, zero_ok=True)
        _positive(f"{r.name}.egress_usd_per_gb", r.egress_usd_per_gb, zero_ok=True)
        _positive(f"{r.name}.local_gbit", r.local_gbit)
        if not 0 <= r.loss < 1:
            raise PlanError(f"{r.name}.loss must be in [0, 1), got {r.loss!r}")
    for name in ("batch_size", "tokens_per_rollout", "bytes_per_changed", "streams", "segment_mb", "snapshot_every",
                 "lease_factor", "initial_lease_s", "steps"):
        _positive(name, getattr(plan, name))
    for name in ("train_s", "preempt_per_hour", "replace_s"):
        _positive(name, getattr(plan, name), zero_ok=True)
    if plan.split not in ("proportional", "uniform"):
        raise PlanError(f"split must be 'proportional' or 'uniform', got {plan.split!r}")
    if not 0 < plan.density <= 1:
        raise PlanError(f"density must be in (0, 1], got {plan.density!r}")
    if not 4 <= plan.steps <= 5000:
        raise PlanError("steps must be in [4, 5000] (the first two are the pipeline filling)")
    # bounds that keep a simulation to seconds: beyond them the answer is obvious anyway
    if plan.actors > 20_000:
        raise PlanError(f"at most 20000 actors, got {plan.actors}")
    if plan.preempt_per_hour > 20:
        raise PlanError(f"preempt_per_hour above 20 (a spot VM living minutes) is not a deployment: "
                        f"{plan.preempt_per_hour}")
    for f in dataclasses.fields(plan.costs):
        _positive(f"costs.{f.name}", getattr(plan.costs, f.name), zero_ok=f.name in ("calibrate_s", "gen_cv"))
    return plan


def _build(cls, raw: Mapping[str, Any], where: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise PlanError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    return {k: v for k, v in raw.items()}


def from_mapping(raw: Mapping[str, Any]) -> Plan:
    """A plan from a parsed TOML/YAML document (see docs/PLANNING.md for the fields)."""
    raw = dict(raw)
    if "model" not in raw:
        raise PlanError("plan: 'model' is required (a Qwen3 size such as 'qwen3-8b', or a table of layer shapes)")
    model = resolve(raw.pop("model"))
    regions_raw = raw.pop("regions", None)
    if not isinstance(regions_raw, list) or not regions_raw:
        raise PlanError("plan: 'regions' must be a non-empty list of tables")
    try:
        regions = tuple(Region(**_build(Region, dict(r), f"regions[{i}]")) for i, r in enumerate(regions_raw))
        costs = Costs(**_build(Costs, dict(raw.pop("costs", {}) or {}), "costs"))
        home = raw.pop("home", regions[0].name)
        plan = Plan(model=model, regions=regions, home=home, costs=costs, **_build(Plan, raw, "plan"))
    except TypeError as exc:
        raise PlanError(f"plan: {exc}") from None
    return validate(plan)


def load(path: str | Path) -> Plan:
    """A plan from a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"cannot read plan file {path}: {exc}") from None
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise PlanError("YAML plans need PyYAML (pip install pyyaml); TOML needs nothing") from None
            raw = yaml.safe_load(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise PlanError(f"{path}: plan files are .toml, .yaml/.yml or .json")
    except PlanError:
        raise
    except Exception as exc:  # the parsers' own error types
        raise PlanError(f"{path}: not a valid {path.suffix[1:]} document: {exc}") from None
    if not isinstance(raw, Mapping):
        raise PlanError(f"{path}: the document must be a table/mapping")
    return from_mapping(raw)
