"""`aurora plan`: configuration, the simulated protocol's behaviour, calibration and the command line."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from aurora_store.cli import main
from aurora_store.errors import AuroraError, PlanError
from aurora_store.plan import calibrate, config, report
from aurora_store.plan.models import QWEN3, resolve
from aurora_store.plan.sim import simulate, stream_rate, wan_rate

BASE = {
    "model": "qwen3-8b", "home": "us", "batch_size": 512, "tokens_per_rollout": 2000, "train_s": 20.0,
    "density": 0.0085, "streams": 4, "steps": 12, "snapshot_every": 100,
    "costs": {"encode_gb_per_s": 3.3},
    "regions": [{"name": "us", "actors": 0},
                {"name": "ca", "actors": 8, "tokens_per_s": 2000.0, "link_mbit": 650.0, "rtt_ms": 50.0,
                 "loss": 7e-7, "egress_usd_per_gb": 0.02}],
}


def plan(**changes) -> config.Plan:
    return config.from_mapping({**BASE, **changes})


def test_qwen3_sizes_match_the_published_parameter_counts():
    assert abs(QWEN3["qwen3-8b"].parameters / 8.19e9 - 1) < 0.01
    assert abs(QWEN3["qwen3-4b"].parameters / 4.02e9 - 1) < 0.01
    assert abs(QWEN3["qwen3-14b"].parameters / 14.77e9 - 1) < 0.01
    assert resolve("8B") is QWEN3["qwen3-8b"]
    with pytest.raises(PlanError, match="unknown model"):
        resolve("qwen3-9b")


@pytest.mark.parametrize("change, message", [
    ({"density": 0.0}, "density"), ({"batch_size": -1}, "batch_size"), ({"home": "mars"}, "home region"),
    ({"regions": [{"name": "us", "actors": 0}]}, "at least one actor"), ({"bogus": 1}, "unknown field"),
    ({"regions": [{"name": "us", "actors": 1, "loss": 1.5}]}, "loss"), ({"steps": 2}, "steps"),
    ({"preempt_per_hour": 100}, "preempt_per_hour"),
])
def test_bad_plans_are_typed_errors(change, message):
    with pytest.raises(PlanError, match=message) as info:
        plan(**change)
    assert isinstance(info.value, AuroraError) and isinstance(info.value, ValueError)


def test_plan_files_in_toml_yaml_and_json(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text('model = "qwen3-4b"\nhome = "us"\nbatch_size = 64\n[[regions]]\nname = "us"\nactors = 2\n'
                    '[[regions]]\nname = "eu"\nactors = 4\nlink_mbit = 500\nrtt_ms = 90\n')
    loaded = config.load(toml)
    assert loaded.region("eu").actors == 4 and loaded.batch_size == 64 and loaded.model is QWEN3["qwen3-4b"]
    (tmp_path / "p.json").write_text(json.dumps(BASE))
    assert config.load(tmp_path / "p.json").region("ca").link_mbit == 650
    yaml = pytest.importorskip("yaml")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(BASE))
    assert config.load(tmp_path / "p.yaml") == config.load(tmp_path / "p.json")
    (tmp_path / "bad.toml").write_text("model = [")
    with pytest.raises(PlanError, match="not a valid toml"):
        config.load(tmp_path / "bad.toml")


def test_loss_caps_one_stream_and_streams_recover_the_link():
    p = plan(regions=[{"name": "us", "actors": 0},
                      {"name": "ca", "actors": 1, "link_mbit": 100.0, "rtt_ms": 50.0, "loss": 0.01}])
    ca = p.region("ca")
    one = stream_rate(ca, p)
    assert one < 100e6 / 8 / 10  # 1 % loss at 50 ms: a few Mbit/s per stream
    assert wan_rate(ca, p, 4) == pytest.approx(4 * one)
    assert wan_rate(ca, p, 1000) == pytest.approx(100e6 / 8 * p.costs.stream_efficiency)


def test_generation_bound_run_is_near_ideal_and_full_broadcast_is_not():
    p = plan()
    delta, ideal = simulate(p), simulate(p, mode="ideal")
    full_1, full_4 = simulate(p, mode="full", streams=1), simulate(p, mode="full", streams=4)
    generation = 512 * 2000 / (8 * 2000)
    assert generation <= ideal.step_s <= delta.step_s <= 1.1 * ideal.step_s
    assert full_4.step_s > 2 * delta.step_s and full_1.step_s > full_4.step_s
    # the one-step lag: B_{k+1} is generated on v_{k-1}
    assert [s.version for s in delta.steps[:4]] == [0, 0, 1, 2]
    # every remote byte crossed once (relay): one delta per step
    assert delta.wan_bytes["ca"] == pytest.approx(12 * p.delta_bytes)


def test_a_slow_region_is_excluded_and_its_actors_idle():
    slow = {"name": "au", "actors": 4, "tokens_per_s": 2000.0, "link_mbit": 20.0, "rtt_ms": 200.0}
    p = plan(regions=[*BASE["regions"], slow])
    result = simulate(p)
    steady = result.steps[3:]
    assert all(s.excluded == 4 for s in steady)  # D_v never arrives within a step: au sits out
    assert result.idle_fraction > 0.3
    doc = report.build(p, timeline=False)
    assert doc["limits"]["binding"] == "train+delivery to au"


def test_without_a_relay_every_actor_pulls_across_the_link():
    p = plan()
    no_relay = dataclasses.replace(p, regions=(p.regions[0], dataclasses.replace(p.regions[1], relay=False)))
    assert simulate(no_relay).wan_bytes["ca"] == pytest.approx(8 * simulate(p).wan_bytes["ca"])
    per_step = report.wan_bytes_per_step(no_relay, 60.0)
    assert per_step["ca"] == pytest.approx(8 * p.delta_bytes)


def test_preemptions_expire_leases_and_cost_a_catch_up():
    spot = dict(BASE["regions"][1], spot=True)
    p = plan(regions=[BASE["regions"][0], spot], preempt_per_hour=2.0, steps=30, seed=3)
    calm = simulate(plan(steps=30))
    rough = simulate(p)
    assert rough.preemptions > 0 and sum(s.lease_expiries for s in rough.steps) > 0
    assert rough.step_s > calm.step_s
    cost = report.catch_up_cost(p, rough.step_s)["ca"]
    assert cost["bytes"] == pytest.approx(p.full_bytes + 50 * p.delta_bytes)
    assert cost["wan_bytes"] == 0  # the relay holds the snapshot and the deltas in the region


def test_report_json_has_the_promised_keys_and_prices(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(BASE))
    out = tmp_path / "t.png"
    assert main(["plan", str(path), "--json", "--plot", str(out), "--steps", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("step_s", "ideal_step_s", "full_broadcast_step_s", "wan_bytes_per_day", "idle_fraction",
                "egress_usd_per_day", "catch_up", "timeline", "limits"):
        assert key in doc
    assert set(doc["full_broadcast_step_s"]) == {"1", "4"}
    per_day = doc["wan_bytes_per_day"]["ca"]
    assert doc["egress_usd_per_day"]["ca"] == pytest.approx(per_day / 1e9 * 0.02, rel=1e-3)
    assert len(doc["timeline"]) == 8 and out.stat().st_size > 10_000


def test_flags_alone_make_a_plan(capsys):
    assert main(["plan", "--model", "qwen3-4b", "--actors", "eu=4:3000", "--link", "eu=500:90:0.00001",
                 "--batch-size", "256", "--tokens-per-rollout", "1000", "--train-s", "10", "--steps", "6"]) == 0
    text = capsys.readouterr().out
    assert "step:" in text and "WAN into eu" in text and "limits:" in text
    assert main(["plan", "--actors", "eu=x"]) == 2


def test_calibration_from_benchmark_json(tmp_path):
    codec = {"bench": "codec", "encode_gb_per_s": 1.5, "apply_gb_per_s": 9.0, "bytes_per_changed": 2.5,
             "density": 0.02}
    wan = {"bench": "wan", "streams": {"rtt_ms": 50.0, "delta_bytes": 4_000_000, "points": [
        {"loss": 0.01, "by_streams": {"1": {"median": 8.0}, "4": {"median": 2.5}}}]}}
    files = []
    for name, doc in (("codec.json", codec), ("wan.json", wan)):
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    cal = calibrate.read(files)
    assert cal.costs["encode_gb_per_s"] == 1.5 and cal.plan["bytes_per_changed"] == 2.5
    # 4 MB in 8 s on one stream at 50 ms and 1 % loss → C = 500 kB/s · 0.05 s · 0.1 / 1448 B
    assert cal.costs["mathis_c"] == pytest.approx(500_000 * 0.05 * 0.1 / 1448)
    calibrated = calibrate.apply(plan(), cal)
    assert calibrated.costs.apply_gb_per_s == 9.0 and calibrated.density == 0.02
    # the calibrated constant reproduces the measured single-stream rate under that loss
    region = dataclasses.replace(calibrated.region("ca"), link_mbit=100.0, rtt_ms=50.0, loss=0.01)
    assert stream_rate(region, calibrated) == pytest.approx(500_000)
    (tmp_path / "other.json").write_text(json.dumps({"bench": "nope"}))
    with pytest.raises(PlanError, match="not a codec"):
        calibrate.read([str(tmp_path / "other.json")])


def test_run_summary_calibrates_generation_and_trainer_costs():
    summary = {"full_bytes": 1_000_000_000, "delta_bytes": [10_000_000] * 5,
               "step_times": [{"wait_s": 4.0, "train_s": 2.0, "publish_s": 0.5, "makespan_s": 6.0}] * 5}
    cal = calibrate.from_run(summary, {3: 7.0, 4: 7.0, 5: 7.0})
    assert cal.plan["train_s"] == pytest.approx(2.5)  # interval − wait − publish
    assert cal.costs["encode_gb_per_s"] == pytest.approx(2.0) and cal.makespan_s == 6.0
    applied = calibrate.apply(plan(), cal)
    assert applied.delta_bytes == pytest.approx(0.01 * applied.full_bytes)
    assert not math.isnan(simulate(applied).step_s)
