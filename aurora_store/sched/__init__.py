"""Scheduling: version-aware eligibility, throughput-proportional allocation, per-prompt leases."""

from aurora_store.sched.allocation import (
    ActorView,
    Eligibility,
    ExpiryBackoff,
    Measurement,
    ThroughputEstimator,
    allocate,
    eligibility,
    refill,
)
from aurora_store.sched.ledger import LeasePolicy, Prompt, StepLedger, Verdict

__all__ = ["ActorView", "Eligibility", "ExpiryBackoff", "LeasePolicy", "Measurement", "Prompt", "StepLedger",
           "ThroughputEstimator", "Verdict", "allocate", "eligibility", "refill"]
