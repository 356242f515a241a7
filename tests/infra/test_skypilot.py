"""Checks of infra/skypilot, offline: every task YAML loads through SkyPilot's own parser (``sky.Task.from_yaml``,
run in SkyPilot's separate venv from ``make sky-venv``, as its pinned click conflicts with ours), the trainer and
relays run on demand and the actors as managed spot jobs that recover, secrets are only named (given at launch
with ``--secret``), and every ``run`` command line — with SkyPilot's environment substituted — parses through our
CLIs' real argument parsers. No cloud is contacted."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.actor import cli as actor_cli
from workers.relay import cli as relay_cli
from workers.trainer import cli as trainer_cli

REPO = Path(__file__).resolve().parents[2]
SKY = REPO / "infra" / "skypilot"
SKY_PYTHON = Path(sys.prefix) / "sky" / "bin" / "python"
YAMLS = {"trainer": SKY / "trainer.yaml", "relay": SKY / "relay.yaml", "actors": SKY / "actors.yaml"}
SENTINEL = "sentinel-secret-9c41"
#: What SkyPilot sets on a node (``SKYPILOT_NUM_GPUS_PER_NODE``) and the shell gives (``HOME``).
NODE_ENV = {"SKYPILOT_NUM_GPUS_PER_NODE": "8", "HOME": "/home/sky"}


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, Any]]:
    if not SKY_PYTHON.is_file():
        pytest.skip(f"SkyPilot's venv is not installed at {SKY_PYTHON.parent.parent} (make sky-venv)")
    out = subprocess.run([str(SKY_PYTHON), str(Path(__file__).with_name("skypilot_probe.py")), SENTINEL,
                          *map(str, YAMLS.values())], capture_output=True, text=True, timeout=180, check=True,
                         cwd=REPO)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: loaded[str(path)] for name, path in YAMLS.items()}


def command(task: dict[str, Any]) -> list[str]:
    """The ``run`` script's one command, with the task's envs, its secrets (as placeholders) and the node's
    variables substituted the way the shell will."""
    env = {**NODE_ENV, **task["envs"], **{name: f"secret-{name}" for name in task["declared_secrets"]}}

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"${match.group(1)} is set neither by the task nor by SkyPilot"
        return env[match.group(1)]

    lines = [line for line in task["run"].splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return shlex.split(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value, lines[0]))


def test_every_yaml_loads_through_skypilot(tasks):
    assert {t["name"] for t in tasks.values()} == {"aurora-trainer", "aurora-relay", "aurora-actor"}
    for task in tasks.values():
        assert task["resources"] and task["setup"].strip().startswith("pip install")


def test_the_trainer_and_relays_run_on_demand_and_actors_as_recovering_spot_jobs(tasks):
    trainer = tasks["trainer"]["resources"]
    assert all(not r["use_spot"] and r["accelerators"] for r in trainer)
    assert {r["region"] for r in trainer} == {tasks["trainer"]["envs"]["AURORA_HOME_REGION"]}
    relay = tasks["relay"]["resources"]
    assert all(not r["use_spot"] and r["ports"] == ["8470"] for r in relay)
    assert {r["region"] for r in relay} == {tasks["relay"]["envs"]["AURORA_REGION"]}
    actors = tasks["actors"]["resources"]
    assert len(actors) >= 2, "several GPU types: a spot shortage of one does not stop the region"
    for r in actors:
        assert r["use_spot"] and r["region"] == tasks["actors"]["envs"]["AURORA_REGION"]
        assert r["job_recovery"]["strategy"] == "FAILOVER" and r["job_recovery"]["max_restarts_on_errors"] >= 1
    assert float(tasks["actors"]["envs"]["AURORA_STOP_GRACE_S"]) < 30  # inside the shortest spot notice


def test_secrets_are_only_named_and_given_at_launch(tasks):
    for name, task in tasks.items():
        assert "AURORA_REDIS_URL" in task["declared_secrets"], name
        assert task["secret_values_given_inline"] == [], name
        assert task["secrets"] == task["declared_secrets"], "every declared secret is taken from --secret"
        text = json.dumps([task["envs"], task["run"], task["setup"]])
        assert SENTINEL not in text
        assert not [k for k in task["envs"] if re.search(r"PASSWORD|TOKEN|SECRET|SIGNING|REDIS_URL", k)], name
    assert "AURORA_SIGNING_KEY" in tasks["trainer"]["declared_secrets"]
    assert "AURORA_CACHE_TOKEN" in tasks["relay"]["declared_secrets"] == tasks["actors"]["declared_secrets"]


def test_every_run_command_parses_through_our_clis(tasks, monkeypatch):
    from torch.distributed.run import get_args_parser

    trainer_task, relay_task, actor_task = tasks["trainer"], tasks["relay"], tasks["actors"]
    argv = command(trainer_task)
    assert argv[0] == "torchrun"
    launch = get_args_parser().parse_args(argv[1:])
    assert launch.standalone and launch.module and launch.training_script == "workers.trainer"
    assert launch.nproc_per_node == NODE_ENV["SKYPILOT_NUM_GPUS_PER_NODE"]
    # The signing key reaches the trainer as AURORA_SIGNING_KEY, the flag's default.
    monkeypatch.setenv("AURORA_SIGNING_KEY", "secret-AURORA_SIGNING_KEY")
    trainer = trainer_cli.parse_args(launch.training_script_args)
    envs = trainer_task["envs"]
    assert (trainer.bucket, trainer.redis, trainer.run) == (envs["AURORA_HOME_BUCKET"], "secret-AURORA_REDIS_URL",
                                                            envs["AURORA_RUN"])
    assert trainer.signing_key == "secret-AURORA_SIGNING_KEY" and trainer.steps == int(envs["AURORA_STEPS"])

    argv = command(relay_task)
    assert argv[:3] == ["python", "-m", "workers.relay"]
    relay = relay_cli.build_parser().parse_args(argv[3:])
    envs = relay_task["envs"]
    assert (relay.source, relay.dest, relay.region) == (envs["AURORA_HOME_BUCKET"], envs["AURORA_REGION_BUCKET"],
                                                        envs["AURORA_REGION"])
    assert relay.cache_port == 8470

    argv = command(actor_task)
    assert argv[:3] == ["python", "-m", "workers.actor"]
    actor = actor_cli.parse_args(argv[3:])
    envs = actor_task["envs"]
    assert (actor.bucket, actor.source_bucket, actor.region) == (envs["AURORA_REGION_BUCKET"],
                                                                 envs["AURORA_HOME_BUCKET"], envs["AURORA_REGION"])
    # Relay and actors of one region read the same buckets and run.
    assert {k: relay_task["envs"][k] for k in ("AURORA_RUN", "AURORA_HOME_BUCKET", "AURORA_REGION_BUCKET")} == \
        {k: envs[k] for k in ("AURORA_RUN", "AURORA_HOME_BUCKET", "AURORA_REGION_BUCKET")}
