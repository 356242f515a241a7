"""What the WAN benchmark runs: sizes, link shapes and repetitions for the full and the ``--quick`` mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks.synthetic import QWEN3_BENCH_CONFIG
from benchmarks.wan_bench.parts import PART_NAMES

PARTS = PART_NAMES
"""The five measurements, in the order they run (``--parts`` selects a subset)."""

MIB = 1 << 20

E2E_MODES = ("ideal", "delta", "full", "delta_sf")
"""Part 5's modes (:mod:`benchmarks.wan_bench.e2e`); ``delta_sf`` runs only when asked for."""


@dataclass(frozen=True)
class E2EConfig:
    """Part 5: short real runs (trainer at home; relay + actors in the remote region), one per mode per round."""

    model_config: dict[str, Any] = field(default_factory=lambda: {
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "head_dim": 64,
        "num_attention_heads": 8, "num_key_value_heads": 4})
    rate_mbit: float = 10.0  # a full broadcast (25 MB) takes ~21 s here: well over the ~10 s generation window
    rtt_ms: float = 50.0
    # Trainer steps per run (steps − skip_steps measured intervals). Short runs, many rounds: the rounds are the
    # units of the interval (t with rounds − 1 df), and a run's bootstrap (~1–2 min on busy cores) is paid anyway.
    steps: int = 8
    full_steps: int = 5  # full (~20 s a step): its ratio to delta is ~2, it needs no ±3 % precision
    skip_steps: int = 2  # step records whose interval to the previous one is not steady state (bootstrap)
    # Modes run interleaved, one run each per round (order rotated per round), and the 95 % interval of a
    # ratio treats rounds as the units: drift of the shared machine between rounds cancels within a round.
    rounds: int = 6
    # ... as many as fit: no round starts unless one more (as long as the slowest so far) ends within this
    budget_s: float = 2400.0
    target_ci_half_width: float = 0.03  # e2e_delta_vs_ideal's 95 % interval must be no wider than ±3 %
    batch_size: int = 9  # prompts per step: three per actor (``--split uniform``, so every step looks alike)
    group_size: int = 8
    actors: int = 3
    # prompts an actor generates together (also sizes its capacity calibration): one step's share, so batch
    # boundaries fall on step boundaries (with 4, a batch straddled two steps and step times alternated ~5/10 s)
    actor_batch_size: int = 3
    # Generation must dominate the step, as in real RL, and take the same time every step. Charged at full
    # length (``--sim-full-length``): 3 prompts × 8 samples × 3 tokens per actor at 7 tokens/s = 10.3 s, every
    # step. One-step-async puts train → publish → stage → generate on a loop two steps long: unless generation
    # outlasts training + publishing + staging (here 2–8 s), the loop binds and its slack alternates between
    # odd and even steps (intervals swung 5 ↔ 9 s at 12 tokens/s with sampled lengths: 4–6 s of generation).
    sim_tokens_per_s: float = 7.0
    sim_full_length: bool = True
    split: str = "uniform"
    lr: float = 1e-6  # a realistic RL step size: deltas of a few % density
    epochs: int = 1  # optimizer updates per batch: keeps training (2 CPU cores) shorter than generation
    # supervised steps before RL, done once for all runs (:mod:`benchmarks.wan_bench.warm`), not once per run
    warm_start_steps: int = 20
    # Measure transfer cost, not its side effects: leases must not expire while an actor waits for a full
    # snapshot, and a relay busy copying one (its heartbeat shares the copy loop) must not be declared dead,
    # which would send every actor to the home bucket across the link. Same settings in every mode.
    lease_factor: float = 20.0
    heartbeat_ttl_s: int = 60
    modes: tuple[str, ...] = ("ideal", "delta", "full")  # any of E2E_MODES
    timeout_s: float = 900.0

    def steps_of(self, mode: str) -> int:
        return self.full_steps if mode == "full" else self.steps


@dataclass(frozen=True)
class BenchConfig:
    quick: bool = False
    seed: int = 0
    # the synthetic model of parts 1–4 (Qwen3-shaped; full bf16 size ≥ 60 s at the lowest rate)
    model_config: dict[str, Any] = field(default_factory=lambda: dict(QWEN3_BENCH_CONFIG, num_hidden_layers=5))
    lr: float = 1e-6  # the realistic Adam step of part 1
    warmup_steps: int = 4
    # part 1: delivery time vs link rate, full weights vs delta
    rates_mbit: tuple[float, ...] = (25.0, 50.0, 100.0, 200.0)
    deliver_rtt_ms: float = 50.0
    deliver_streams: int = 4
    delta_repeats: int = 3
    full_repeats: int = 1
    snapshot_shards: int = 4  # weight files of the snapshot, so ``deliver_streams`` streams can share the work
    # parts 2–4: a bigger delta (one Adam step at ``big_lr``) in ~1 MiB segments, so there is something to stripe
    big_lr: float = 1e-5
    big_segment_bytes: int = 1 * MIB
    # part 2: 1 vs S streams under RTT and random loss
    streams_rate_mbit: float = 100.0
    streams_rtt_ms: float = 50.0
    losses: tuple[float, ...] = (0.001, 0.01)
    stream_counts: tuple[int, ...] = (1, 2, 4, 8)
    streams_repeats: int = 3
    # part 3: cut-through (streaming upload) vs encode-then-upload, relay copying in the remote region
    cut_rate_mbit: float = 25.0
    cut_rtt_ms: float = 50.0
    cut_repeats: int = 2
    # Part 3 with each region on its own CPUs (home: the trainer's encoder, its S3 server and Redis; remote: the
    # relay, the actors, the regional S3 server), as on separate machines. Shared, the encoder and the remote
    # decoders compete for every core and CPU-bound stages cannot overlap however the transfer is pipelined
    # (on 2 cores: end-to-end ratio 0.63-0.77 shared vs ~0.41 pinned). Every mode of part 3 alike.
    cut_pin_regions: bool = True
    # part 3, end to end: full cut-through (streaming upload, relay copying on segment events, actors prefetching
    # and reading the relay's cache) vs store-and-forward (encode then upload, relay copying after the manifest,
    # actors fetching after the regional manifest), publish start → the last of ``overlap_actors`` remote actors
    # staged. The link is sized so encoding, the WAN copy and the fanout each take a visible share.
    overlap_rate_mbit: float = 10.0
    overlap_rtt_ms: float = 50.0
    overlap_actors: int = 2
    overlap_repeats: int = 2
    # part 4: relay vs direct, ``relay_actors`` actors in the remote region
    relay_rate_mbit: float = 50.0
    relay_rtt_ms: float = 50.0
    relay_actors: int = 4
    # part 5
    e2e: E2EConfig = field(default_factory=E2EConfig)
    # calibration window per link shape (bulk transfers run for this long, 1 and 4 streams)
    calibrate_seconds: float = 3.0
    parts: tuple[str, ...] = PARTS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def full_config(**overrides: Any) -> BenchConfig:
    return replace(BenchConfig(), **overrides)


def quick_config(**overrides: Any) -> BenchConfig:
    """Smaller model, fewer points: the whole thing in about three minutes (the test runs this)."""
    base = BenchConfig(
        quick=True,
        model_config=dict(QWEN3_BENCH_CONFIG, num_hidden_layers=1, vocab_size=8192),
        # the lowest rate such that the full weights of this small model take long enough (~35 s) for the delta
        # to meet the 20x target: at 50 Mbit/s they take ~13 s and the delta's fixed costs (RTTs, staging) cap
        # the ratio near 12x
        rates_mbit=(12.0, 200.0), delta_repeats=2,
        big_lr=2e-5, big_segment_bytes=256 * 1024,
        losses=(0.01,), stream_counts=(1, 4), streams_repeats=2,
        # the small model's delta crosses in ~1.6 s here, about its encode + fanout on two quiet cores: no stage
        # dominates (with the WAN copy dominant the ratio tends to 1 whatever overlaps)
        cut_repeats=2, overlap_repeats=2, overlap_rate_mbit=30.0,
        e2e=E2EConfig(model_config={}, rate_mbit=2.0, steps=6, full_steps=5, batch_size=6, group_size=4, actors=2,
                      sim_tokens_per_s=12.0, warm_start_steps=10, rounds=1, budget_s=600.0,
                      target_ci_half_width=1.0),  # one small round on busy cores: the machinery, not precision
        calibrate_seconds=1.5,
        parts=tuple(p for p in PARTS if p != "e2e"),
    )
    return replace(base, **overrides)
