"""Scheduling: version-aware eligibility, throughput-proportional allocation, per-prompt leases."""

from aurora_store.sched.allocation import ActorView, Eligibility, ThroughputEstimator, allocate, eligibility
from aurora_store.sched.ledger import LeasePolicy, Prompt, StepLedger, Verdict

__all__ = ["ActorView", "Eligibility", "LeasePolicy", "Prompt", "StepLedger", "ThroughputEstimator", "Verdict",
           "allocate", "eligibility"]
