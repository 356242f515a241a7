"""Run by tests/infra/test_skypilot.py with the Python of SkyPilot's own venv (``make sky-venv``): load each task
YAML named on the command line through SkyPilot's parser, the way ``sky launch --secret NAME`` does, and print
what it made of them as one JSON object. Imports nothing of Aurora (SkyPilot's venv does not have it)."""

from __future__ import annotations

import json
import sys

import sky
import yaml


def load(path: str, sentinel: str) -> dict:
    sky.Task.from_yaml(path)  # exactly as `sky launch PATH` parses it, secrets left to be given at launch
    with open(path) as handle:
        config = yaml.safe_load(handle)
    declared = sorted(config.get("secrets") or {})
    task = sky.Task.from_yaml_config(config, secrets_overrides=[(name, sentinel) for name in declared])
    return {
        "name": task.name,
        "setup": task.setup,
        "run": task.run,
        "envs": dict(task.envs),
        "declared_secrets": declared,
        "secrets": sorted(task.secrets),
        "secret_values_given_inline": [k for k, v in (config.get("secrets") or {}).items() if v is not None],
        "resources": [{"use_spot": r.use_spot, "cloud": str(r.cloud) if r.cloud else None, "region": r.region,
                       "accelerators": r.accelerators, "job_recovery": r.job_recovery, "ports": r.ports}
                      for r in task.resources],
    }


if __name__ == "__main__":
    sentinel, *paths = sys.argv[1:]
    print(json.dumps({path: load(path, sentinel) for path in paths}))
