"""``aurora plan``: a discrete-event simulation of a deployment, calibrated by our own benchmarks.

``config`` (what is simulated), ``models`` (parameter counts), ``sim`` (the SimPy model of the protocol),
``calibrate`` (per-component costs from benchmark JSON and real runs), ``report`` (summary, JSON, plot).
Imports nothing from ``workers`` or ``benchmarks``.
"""

from aurora_store.plan.config import Costs, Plan, Region, from_mapping, load
from aurora_store.plan.sim import SimResult, simulate

__all__ = ["Costs", "Plan", "Region", "SimResult", "from_mapping", "load", "simulate"]
