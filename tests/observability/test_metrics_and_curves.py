"""Every process exposes Prometheus metrics while it runs; the trainer writes TensorBoard (and offline
W&B) curves; logs are JSON lines with run, process and version."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workers.cluster import ClusterSpec, LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]
STEPS = 8


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def total(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("obs"), steps=STEPS, batch_size=16, group_size=4,
                       actors={"us-east": 1, "eu-west": 1}, metrics=True,
                       trainer_args=["--wandb", "--kl-coef", "0.05"],
                       actor_args=["--sim-tokens-per-s", "400"],
                       env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    with LocalCluster(spec) as cluster:
        cluster.wait_for(lambda: cluster.trainer_version() >= 4, 240, "version 4")
        live = {}
        for _ in range(20):  # one consistent moment: the actor's gauge equals what it reports to Redis
            live = {name: scrape(port) for name, port in cluster.metrics_ports().items()}
            states = {a: s for a, (s, _) in cluster.plane.actors().items()}
            if all(live[f"actor-{a}"]["aurora_version_active"] == states[a].active_version for a in states):
                break
        summary = cluster.wait_trainer_done(300)
        yield {"cluster": cluster, "live": live, "states": states, "summary": summary}


def test_every_process_serves_its_series(run):
    live = run["live"]
    trainer, relay = live["trainer"], live["relay-eu-west"]
    for name in ("aurora_version_published", "aurora_delta_bytes", "aurora_delta_density",
                 "aurora_encode_seconds_count", "aurora_upload_seconds_count", "aurora_publish_seconds_count",
                 "aurora_leases_total{event=granted}", "aurora_results_received_total", "aurora_step"):
        assert name in trainer, name
    assert trainer["aurora_version_published"] >= 4 and 0 < trainer["aurora_delta_density"] <= 1
    assert trainer["aurora_encode_seconds_count"] >= 4 and trainer["aurora_leases_total{event=granted}"] >= 64
    assert any(k.startswith("aurora_scheduler_share{actor=") for k in trainer)
    assert relay["aurora_cross_region_bytes_total"] > 0 and relay["aurora_version_published"] >= 3
    # The hot cache serves the region's actor (cut-through): hits, bytes served, and the actor's side of it.
    assert relay["aurora_cache_hits_total"] > 0 and relay["aurora_cache_served_bytes_total"] > 0
    assert 0 < relay["aurora_cache_hit_ratio"] <= 1
    remote = live["actor-eu-west-1"]
    assert remote["aurora_relay_cache_reads_total{outcome=hit}"] > 0 and remote["aurora_prefetched_bytes_total"] > 0
    assert remote["aurora_staged_after_manifest_seconds_count"] >= 2
    for actor in ("actor-us-east-1", "actor-eu-west-1"):
        samples = live[actor]
        assert samples["aurora_tokens_per_second"] > 0 and samples["aurora_tokens_generated_total"] > 0
        assert samples["aurora_activate_seconds_count"] >= 2 and samples["aurora_fetch_seconds_count"] >= 2
        assert samples["aurora_version_lag"] <= 2


def test_values_are_consistent(run):
    live, states = run["live"], run["states"]
    for actor_id, state in states.items():
        assert live[f"actor-{actor_id}"]["aurora_version_active"] == state.active_version
    trainer = live["trainer"]
    settled = total(trainer, "aurora_rollouts_total")
    returned = trainer["aurora_leases_total{event=returned}"]
    assert trainer["aurora_results_received_total"] == settled + returned
    assert total(trainer, "aurora_rollouts_total{outcome=accepted") >= 3 * 16


def test_tensorboard_event_files_are_readable(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = run["summary"]["logdir"]
    events = EventAccumulator(logdir)
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("reward/mean", "loss/policy", "loss/kl", "time/generation_wait_s", "time/train_s",
                "time/publish_s", "delta/bytes"):
        assert tag in tags, tag
    assert [e.step for e in events.Scalars("reward/mean")] == list(range(1, STEPS + 1))
    # --kl-coef 0.05: the penalty's coefficient and its k3 estimate are curves; the policy moves away from
    # the reference, so the estimate is positive once it has been trained on
    assert all(e.value == pytest.approx(0.05) for e in events.Scalars("loss/kl_coef"))
    assert max(e.value for e in events.Scalars("loss/kl")) > 0


def test_wandb_offline_run_was_written(run):
    from pathlib import Path

    runs = list(Path(run["summary"]["logdir"]).rglob("offline-run-*"))
    assert runs, "no offline W&B run directory"


def test_logs_are_json_lines_with_run_process_and_version(run):
    log_dir = run["cluster"].run_dir / "logs"
    for name in ("trainer", "actor-us-east-1", "relay-eu-west"):
        lines = [json.loads(line) for line in (log_dir / f"{name}.log").read_text().splitlines()
                 if line.startswith("{")]
        records = [r for r in lines if "level" in r]  # (the trainer also prints its summary as JSON)
        assert records, name
        assert all(r["run"] == "test" and "version" in r and r.get("process") for r in records), name
