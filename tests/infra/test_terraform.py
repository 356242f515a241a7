"""Checks of infra/terraform: formatting, `terraform validate` and an offline `terraform plan` of the AWS root
(with the local hashicorp/aws plugin), the GCP root's contract (parsed with python-hcl2, no Google provider
here), the startup scripts' command lines against the real argument parsers of the actor and relay, the
bucket policy and IAM least privilege, and an apply of the bucket module against the local S3 server."""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import functools
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.actor import cli as actor_cli
from workers.relay import cli as relay_cli
from workers.trainer import cli as trainer_cli

REPO = Path(__file__).resolve().parents[2]
TF = REPO / "infra" / "terraform"
MODULES = TF / "modules"
TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not on PATH")

# Sample values substituted into the startup-script templates.
HOME_URL = "s3://aurora-demo-us-east-1/demo?region=us-east-1"
REGIONAL_URL = "s3://aurora-demo-eu-west-1/demo?region=eu-west-1"
REDIS_URL = "rediss://:0123456789abcdef0123456789abcdef@master.aurora-demo.abc123.use1.cache.amazonaws.com:6379/0"
PUBLIC_KEY = "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE="
TEMPLATE_VALUES = {
    "run": "demo",
    "region": "eu-west-1",
    "bucket_url": REGIONAL_URL,
    "source_bucket_url": HOME_URL,
    "redis_parameter_name": "/aurora/demo/redis-url/actor",
    "cache_token_parameter": "/aurora/demo/cache-token",
    "redis_parameter_region": "us-east-1",
    "redis_secret_id": "projects/my-project/secrets/aurora-demo-redis-url",
    "redis_ca_cert": "-----BEGIN CERTIFICATE-----\nMIIBsample\n-----END CERTIFICATE-----",
    "redis_ca_path": "/etc/aurora/redis-ca.pem",
    "pip_requirements": "'aurora-rl[rl] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl' 'vllm==0.10.1'",
    "pip_extra_args": "--extra-index-url https://download.pytorch.org/whl/cu124",
    "engine": "vllm",
    "trainer_public_key": PUBLIC_KEY,
    "metrics_port": "9400",
    "model_url": "hf://Qwen/Qwen3-0.6B",
    "stop_timeout_s": "90",
    "cache_port": "8470",
    "signing_key_secret_id": "aurora/demo/trainer-signing-key",
    "admission_secret_id": "aurora/demo/admission-secret",
    "data_device": "/dev/disk/by-id/google-aurora-ckpt",
    "data_volume_tag": "aurora-checkpoint-volume",
    "nproc_per_node": "4",
    "trainer_args": "--steps 2000 --model /var/lib/aurora-trainer/model --batch-size 64",
}
OPTIONAL = {  # template values that may be empty, by systemd unit (the template then omits the option)
    "aurora-actor": ("source_bucket_url", "engine", "trainer_public_key", "metrics_port"),
    "aurora-relay": ("trainer_public_key", "metrics_port"),
    "aurora-trainer": ("metrics_port", "trainer_args"),
}
TEMPLATES = {  # template -> (module dir, systemd unit it writes)
    "aws-actors/templates/actor-user-data.sh.tftpl": ("aws-actors", "aurora-actor"),
    "aws-relay/templates/relay-user-data.sh.tftpl": ("aws-relay", "aurora-relay"),
    "gcp-actors/templates/actor-startup.sh.tftpl": ("gcp-actors", "aurora-actor"),
    "gcp-relay/templates/relay-startup.sh.tftpl": ("gcp-relay", "aurora-relay"),
}
TRAINER_TEMPLATES = {  # the trainer's boot scripts: torchrun -m workers.trainer as a systemd unit
    "aws-trainer/templates/trainer-user-data.sh.tftpl": ("aws-trainer", "aurora-trainer"),
    "gcp-trainer/templates/trainer-startup.sh.tftpl": ("gcp-trainer", "aurora-trainer"),
}
S3_DELETE_ACTIONS = ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:DeleteBucket", "s3:PutLifecycleConfiguration",
                     "s3:PutBucketPolicy", "s3:DeleteBucketPolicy")


# --- helpers: terraform ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def aws_plugin_dir() -> Path | None:
    """The local plugin directory holding hashicorp/aws 5.x: six levels above the provider binary."""
    pattern = "registry.terraform.io/hashicorp/aws/5.*/*/terraform-provider-aws_*"
    roots = ["/opt", "/usr/share", "/usr/local/share", "/usr/local/lib", "/usr/lib",
             str(Path.home() / ".terraform.d"), str(Path.home() / ".local/share/terraform")]
    for root in roots:
        for depth in ("", "*/", "*/*/"):
            for binary in sorted(glob.glob(f"{root}/{depth}{pattern}")):
                return Path(binary).parents[5]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        found = subprocess.run(["find", "/", "-xdev", "-name", "terraform-provider-aws_*", "-not", "-path", "/proc/*"],
                               capture_output=True, text=True, timeout=60).stdout
        for line in sorted(found.splitlines()):
            binary = Path(line)
            if (len(binary.parents) > 5 and binary.parents[2].name == "aws" and binary.parents[3].name == "hashicorp"
                    and binary.parents[1].name.startswith("5.")):
                return binary.parents[5]
    return None


def tf_env(workdir: Path) -> dict[str, str]:
    """A deterministic environment: no user CLI config, no TF_VAR_/TF_CLI_ARGS leaking in."""
    config = workdir / "empty.tfrc"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_VAR_", "TF_CLI_ARGS", "TF_WORKSPACE"))}
    env.update(TF_CLI_CONFIG_FILE=str(config), TF_IN_AUTOMATION="1", TF_INPUT="0", CHECKPOINT_DISABLE="1")
    env.pop("TF_PLUGIN_CACHE_DIR", None)
    env.pop("TF_DATA_DIR", None)
    return env


def terraform(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([TERRAFORM, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"terraform {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def copy_tree(dest: Path) -> Path:
    """A copy of infra/terraform without local state, caches or auto-loaded variable files."""
    return Path(shutil.copytree(TF, dest / "terraform", ignore=shutil.ignore_patterns(
        ".terraform", ".terraform.lock.hcl", "*.tfstate", "*.tfstate.*", "terraform.tfvars", "*.auto.tfvars",
        "*.tfplan")))


OFFLINE_PROVIDER = """
provider "aws" {{
{alias}  access_key                  = "AKIAOFFLINEPLAN00000"
  secret_key                  = "offline-plan-not-a-secret"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}}
"""

PLAN_VARS = {
    "run": "demo",
    "home_region": "us-east-1",
    "remote_regions": ["eu-west-1", "ap-southeast-2"],
    "package_spec": "aurora-rl[rl] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl",
    "extra_pip_packages": ["vllm==0.10.1"],
    "redis_auth_token": "0123456789abcdef0123456789abcdef",
    "gc_principal_arns": ["arn:aws:iam::123456789012:role/ops"],
    "trainer_public_key": PUBLIC_KEY,
    "engine": "vllm",
    "metrics_port": 9400,
    "availability_zones": {"us-east-1": ["us-east-1a", "us-east-1b"], "eu-west-1": ["eu-west-1a", "eu-west-1b"],
                           "ap-southeast-2": ["ap-southeast-2a", "ap-southeast-2b"]},
    "trainer_instance_type": "p5.48xlarge",
    "trainer_gpus": 8,
    "trainer_data_volume_gb": 2000,
    "trainer_args": ["--steps", "2000", "--model", "/var/lib/aurora-trainer/model"],
}


def remote_slots() -> list[str]:
    """The AWS root's remote-region provider aliases (remote1…remoteN, see providers.tf)."""
    return re.findall(r'alias\s*=\s*"(remote\d+)"', (TF / "aws" / "providers.tf").read_text())


@dataclass
class AwsRoots:
    validate_root: Path
    env: dict[str, str]
    plan: Future  # -> `terraform show -json` of the offline plan
    deploy_plan: Future  # -> the same, of docs/DEPLOY.md's minimal AWS tfvars


def _offline_plan(root: Path, env: dict[str, str]) -> dict:
    terraform(["plan", "-input=false", "-refresh=false", "-lock=false", "-no-color", "-var-file=test.tfvars.json",
               "-out=test.tfplan"], root, env, timeout=180)
    return json.loads(terraform(["show", "-json", "test.tfplan"], root, env).stdout)


@pytest.fixture(scope="module")
def aws_roots() -> Iterator[AwsRoots]:
    """Two copies of the AWS root, initialised from the local plugin directory: one for `terraform validate`, one
    planned in the background (to keep the test file fast) with fake static credentials. No API is called by the
    plan (no data source is read when availability zones and GC principals are given), so the rendered startup
    scripts are known."""
    if TERRAFORM is None:
        pytest.skip("terraform is not on PATH")
    plugins = aws_plugin_dir()
    if plugins is None:
        pytest.skip("no local hashicorp/aws 5.x provider plugin found (looked under /opt, /usr/share, "
                    "~/.terraform.d, ... and with find /): cannot run terraform init offline")
    workdir = Path(tempfile.mkdtemp(prefix="aurora-tf-"))
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        env = tf_env(workdir)
        validate_root = copy_tree(workdir / "validate") / "aws"
        plan_root = copy_tree(workdir / "plan") / "aws"
        (plan_root / "offline_override.tf").write_text("".join(
            OFFLINE_PROVIDER.format(alias=f'  alias = "{alias}"\n' if alias else "")
            for alias in (None, *remote_slots())))
        (plan_root / "test.tfvars.json").write_text(json.dumps(PLAN_VARS))
        deploy_root = copy_tree(workdir / "deploy") / "aws"
        (deploy_root / "offline_override.tf").write_text((plan_root / "offline_override.tf").read_text())
        (deploy_root / "test.tfvars.json").write_text(json.dumps({**deploy_tfvars()["aws"], **DEPLOY_OFFLINE_VARS}))
        init = ["init", "-backend=false", "-input=false", f"-plugin-dir={plugins}", "-no-color"]
        roots = (validate_root, plan_root, deploy_root)
        for done in [pool.submit(terraform, init, root, env) for root in roots]:
            done.result()
        yield AwsRoots(validate_root, env, pool.submit(_offline_plan, plan_root, env),
                       pool.submit(_offline_plan, deploy_root, env))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(workdir, ignore_errors=True)


# --- helpers: docs/DEPLOY.md ------------------------------------------------------------------------------------

DEPLOY = REPO / "docs" / "DEPLOY.md"
# What only the offline plan needs on top of the walkthrough's tfvars: zones and GC principals (else data sources
# call the API) and the Redis secret the walkthrough exports as TF_VAR_redis_auth_token.
DEPLOY_OFFLINE_VARS = {
    "availability_zones": {"us-east-1": ["us-east-1a", "us-east-1b"], "eu-west-1": ["eu-west-1a", "eu-west-1b"]},
    "gc_principal_arns": ["arn:aws:iam::123456789012:role/ops"],
    "redis_auth_token": "0123456789abcdef0123456789abcdef",
}


def deploy_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DEPLOY.read_text(), re.S | re.M)


@functools.cache
def deploy_tfvars() -> dict[str, dict]:
    """The walkthrough's terraform.tfvars per cloud (each block names its file on its first line)."""
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install python-hcl2)")
    options = hcl2.SerializationOptions(strip_string_quotes=True, explicit_blocks=False)
    found = {}
    for block in deploy_blocks("hcl"):
        cloud = re.match(r"# infra/terraform/(aws|gcp)/terraform\.tfvars\n", block)
        assert cloud, f"a tfvars block of DEPLOY.md does not name its file: {block[:80]!r}"
        found[cloud.group(1)] = {k: v for k, v in hcl2.loads(block, serialization_options=options).items()
                                 if k != "__comments__"}
    assert set(found) == {"aws", "gcp"}
    return found


def deploy_shell_commands() -> list[list[str]]:
    """Every command line of the walkthrough's sh blocks, split like a shell would (comments dropped, $(…) kept)."""
    commands = []
    for block in deploy_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:  # a line that is only a comment is no command
                commands.append(argv)
    return commands


@pytest.fixture(scope="module")
def aws_plan(aws_roots) -> dict:
    return aws_roots.plan.result(timeout=300)


# --- helpers: HCL ------------------------------------------------------------------------------------------


@functools.cache
def hcl_dir(path: Path) -> dict[str, list]:
    """All .tf files of a directory, parsed with python-hcl2 and merged."""
    merged: dict[str, list] = {}
    for tf_file in sorted(path.glob("*.tf")):
        for key, value in load_hcl(tf_file).items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
    return merged


def load_hcl(path: Path) -> dict:
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install python-hcl2)")
    if not hasattr(hcl2, "SerializationOptions"):
        pytest.skip("python-hcl2 >= 8 is needed (SerializationOptions)")
    options = hcl2.SerializationOptions(strip_string_quotes=True, explicit_blocks=False)
    with open(path) as f:
        return hcl2.load(f, serialization_options=options)


def named(doc: dict, kind: str) -> dict[str, dict]:
    """variable / output / module / locals blocks by name."""
    return {name: body for entry in doc.get(kind, []) for name, body in entry.items() if name != "__comments__"}


def typed(doc: dict, kind: str, type_: str) -> dict[str, dict]:
    """resource / data blocks of one type, by name."""
    return {name: body for entry in doc.get(kind, []) for name, body in entry.get(type_, {}).items()
            if name != "__comments__"}


def walk(node, key: str) -> Iterator:
    """Every value stored under `key` anywhere below node (dynamic block contents included)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, key)


def statements(document: dict) -> list[dict]:
    return list(document.get("statement", []))


# --- helpers: templates ------------------------------------------------------------------------------------

_IF = re.compile(r'%\{\s*if\s+(\w+)\s*!=\s*""\s*\}(.*?)%\{\s*endif\s*\}', re.S)
_INTERPOLATION = re.compile(r"(?<!\$)\$\{([^}]*)\}")
_DIRECTIVE = re.compile(r"(?<!%)%\{")


def template_variables(text: str) -> set[str]:
    names = {m.group(1) for m in _IF.finditer(text)}
    for m in _INTERPOLATION.finditer(_IF.sub(lambda m: m.group(2), text)):
        assert re.fullmatch(r"\w+", m.group(1)), f"the test cannot render the expression ${{{m.group(1)}}}"
        names.add(m.group(1))
    return names


def render(text: str, values: dict[str, str]) -> str:
    """Terraform's templatefile() for the subset the templates use: ${name}, %{ if name != "" }...%{ endif },
    and the $${ / %%{ escapes."""
    text = _IF.sub(lambda m: m.group(2) if values[m.group(1)] != "" else "", text)
    assert not _DIRECTIVE.search(text), "template uses a directive the test cannot render"
    text = _INTERPOLATION.sub(lambda m: str(values[m.group(1)]), text)
    return text.replace("$${", "${").replace("%%{", "%{")


def render_with_terraform(jobs: list[tuple[Path, dict[str, str]]]) -> list[str]:
    """The same templates rendered by Terraform itself (terraform console needs no provider)."""
    def call(path: Path, values: dict[str, str]) -> str:
        variables = ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
        return f"templatefile({json.dumps(str(path))}, {{{variables}}})"

    calls = ", ".join(call(path, values) for path, values in jobs)
    with tempfile.TemporaryDirectory(prefix="aurora-tf-console-") as tmp:
        result = subprocess.run([TERRAFORM, "console"], input=f"jsonencode([{calls}])\n", cwd=tmp,
                                env=tf_env(Path(tmp)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(json.loads(result.stdout.strip()))


def unit_section(script: str, unit: str) -> str:
    """The body of the systemd unit file the script writes."""
    match = re.search(rf"cat > /etc/systemd/system/{unit}\.service <<'UNIT'\n(.*?)\nUNIT\n", script, re.S)
    assert match, f"the script does not write /etc/systemd/system/{unit}.service"
    return match.group(1)


def exec_argv(script: str, unit: str, redis_url: str = REDIS_URL) -> tuple[list[str], str]:
    """ExecStart of the unit, split the way systemd does for these plain words, with ${AURORA_REDIS_URL}
    taken from the unit's EnvironmentFile (which the script fills with the URL it reads at boot)."""
    body = unit_section(script, unit)
    env_file = re.search(r"^EnvironmentFile=(\S+)$", body, re.M)
    assert env_file, f"{unit} has no EnvironmentFile"
    assert re.search(rf"cat > {re.escape(env_file.group(1))} <<ENV\nAURORA_REDIS_URL=\$REDIS_URL\n", script), \
        "the environment file must receive the Redis URL read at boot"
    lines = [line for line in body.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1
    command = lines[0].removeprefix("ExecStart=")
    assert "%" not in command, "systemd would expand % specifiers"
    assert command.count("$") == 1 and "${AURORA_REDIS_URL}" in command
    return shlex.split(command.replace("${AURORA_REDIS_URL}", redis_url)), body


def parse_worker(argv: list[str], module: str):
    assert argv[0].endswith("/python") and argv[1:3] == ["-m", module], argv[:3]
    parser = (actor_cli if module == "workers.actor" else relay_cli).build_parser()
    return parser.parse_args(argv[3:])


def parse_trainer(argv: list[str]):
    """torchrun's own parser, then the trainer's: both must accept the unit's command line."""
    from torch.distributed.run import get_args_parser

    assert argv[0] == "/opt/aurora/venv/bin/torchrun", argv[:1]
    launch = get_args_parser().parse_args(argv[1:])
    assert launch.standalone and launch.module and launch.training_script == "workers.trainer", launch
    return launch, trainer_cli.parse_args(launch.training_script_args)


def assert_stops_with_sigterm(unit_body: str) -> None:
    assert re.search(r"^KillSignal=SIGTERM$", unit_body, re.M)
    timeout = re.search(r"^TimeoutStopSec=(\d+)$", unit_body, re.M)
    assert timeout and int(timeout.group(1)) >= 60


# --- formatting and validation -------------------------------------------------------------------------------


@needs_terraform
def test_terraform_fmt_is_clean():
    with tempfile.TemporaryDirectory(prefix="aurora-tf-fmt-") as tmp:
        result = subprocess.run([TERRAFORM, "fmt", "-check", "-recursive", "-diff", str(TF)], capture_output=True,
                                text=True, timeout=60, env=tf_env(Path(tmp)))
    assert result.returncode == 0, f"run `terraform fmt -recursive infra/terraform`:\n{result.stdout}{result.stderr}"


def test_module_sources_exist():
    roots = [TF / "aws", TF / "gcp", *sorted(p for p in MODULES.iterdir() if p.is_dir())]
    for root in roots:
        for name, block in named(hcl_dir(root), "module").items():
            assert (root / block["source"]).resolve().is_dir(), f"{root.name}: module {name} source {block['source']}"


def test_aws_root_validates(aws_roots):
    result = subprocess.run([TERRAFORM, "validate", "-json", "-no-color"], cwd=aws_roots.validate_root,
                            env=aws_roots.env, capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    assert report["valid"], json.dumps(report["diagnostics"], indent=1)
    assert report["error_count"] == 0 and report["warning_count"] == 0, json.dumps(report["diagnostics"], indent=1)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_example_tfvars_set_declared_variables(cloud):
    variables = named(hcl_dir(TF / cloud), "variable")
    example = {k: v for k, v in load_hcl(TF / cloud / "terraform.tfvars.example").items() if k != "__comments__"}
    assert set(example) <= set(variables), f"undeclared: {sorted(set(example) - set(variables))}"
    required = {name for name, v in variables.items() if "default" not in v} - {"redis_auth_token"}  # TF_VAR_...
    assert required <= set(example), f"the example lacks {sorted(required - set(example))}"
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,19}", example["run"])
    assert example["home_region"] not in example["remote_regions"]
    from aurora_store.trust import Verifier

    Verifier.load(example["trainer_public_key"])  # a key actors accept (raw Ed25519, as `aurora keygen` writes)


# --- the startup scripts against the real command lines --------------------------------------------------------


@pytest.mark.parametrize("template", sorted(TEMPLATES | TRAINER_TEMPLATES))
def test_template_variables_match_module(template):
    """Every ${name} a template uses is passed by its module's templatefile() call, and nothing more."""
    module, _ = (TEMPLATES | TRAINER_TEMPLATES)[template]
    used = template_variables((MODULES / template).read_text())
    source = (MODULES / module / "main.tf").read_text()
    name = re.escape(Path(template).name)
    call = re.search(rf'templatefile\("\$\{{path\.module\}}/templates/{name}", \{{(.*?)\n\s*\}}\)', source, re.S)
    assert call, f"{module}/main.tf does not render {template}"
    passed = set(re.findall(r"^\s*(\w+)\s*=", call.group(1), re.M))
    assert used == passed, f"used, not passed: {sorted(used - passed)}; passed, unused: {sorted(passed - used)}"
    assert used <= set(TEMPLATE_VALUES), f"no sample value for {sorted(used - set(TEMPLATE_VALUES))}"


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("optional", [True, False], ids=["all-options", "no-options"])
def test_startup_command_parses_with_real_cli(template, optional):
    _, unit = TEMPLATES[template]
    text = (MODULES / template).read_text()
    values = {k: v for k, v in TEMPLATE_VALUES.items() if k in template_variables(text)}
    if not optional:
        values.update({k: "" for k in OPTIONAL[unit]})
    script = render(text, values)
    argv, body = exec_argv(script, unit)
    assert_stops_with_sigterm(body)
    if unit == "aurora-actor":
        config = parse_worker(argv, "workers.actor")
        assert config.bucket == REGIONAL_URL
        assert config.source_bucket == (HOME_URL if optional else None)
        assert config.engine == ("vllm" if optional else None)
    else:
        config = parse_worker(argv, "workers.relay")
        assert (config.source, config.dest) == (HOME_URL, REGIONAL_URL)
    assert (config.redis, config.region, config.run) == (REDIS_URL, "eu-west-1", "demo")
    assert config.trainer_public_key == (PUBLIC_KEY if optional else os.environ.get("AURORA_TRAINER_PUBLIC_KEY"))
    assert config.metrics_port == (9400 if optional else None)
    assert config.cache_dir == "/var/cache/aurora"


@pytest.mark.parametrize("template", sorted(TRAINER_TEMPLATES))
@pytest.mark.parametrize("optional", [True, False], ids=["all-options", "no-options"])
def test_trainer_startup_command_parses_with_torchrun_and_trainer_cli(template, optional):
    _, unit = TRAINER_TEMPLATES[template]
    text = (MODULES / template).read_text()
    values = {k: v for k, v in TEMPLATE_VALUES.items() if k in template_variables(text)}
    if not optional:
        values.update({k: "" for k in OPTIONAL[unit]})
    script = render(text, values)
    argv, body = exec_argv(script, unit)
    assert_stops_with_sigterm(body)
    launch, config = parse_trainer(argv)
    assert launch.nproc_per_node == "4"
    assert (config.bucket, config.redis, config.region, config.run) == (REGIONAL_URL, REDIS_URL, "eu-west-1", "demo")
    assert config.checkpoint_dir == "/var/lib/aurora-trainer/checkpoint"  # on the data volume, mounted first
    assert "RequiresMountsFor=/var/lib/aurora-trainer" in body
    # The signing key: a tmpfs file the unit fetches from the secret manager before every start.
    assert config.signing_key == "/run/aurora-trainer/signing-key" and "RuntimeDirectory=aurora-trainer" in body
    assert "ExecStartPre=/usr/local/sbin/aurora-signing-key /run/aurora-trainer/signing-key" in body
    fetcher = re.search(r"cat > /usr/local/sbin/aurora-signing-key <<'KEY'\n(.*?)\nKEY\n", script, re.S)
    assert fetcher and values["signing_key_secret_id"] in fetcher.group(1)
    compile(fetcher.group(1), "aurora-signing-key", "exec")  # valid Python once rendered
    assert config.metrics_port == (9400 if optional else None)
    assert (config.steps, config.model, config.batch_size) == ((2000, "/var/lib/aurora-trainer/model", 64)
                                                               if optional else (40, None, 32))
    device = values.get("data_device") or "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${VOLUME//-/}"
    assert f"DEVICE={device}" in script.replace('"', "") and "mkfs.ext4" in script and "blkid" in script


@needs_terraform
def test_python_renderer_matches_terraform_templatefile():
    jobs = []
    for template, (_, unit) in sorted((TEMPLATES | TRAINER_TEMPLATES).items()):
        text = (MODULES / template).read_text()
        values = {k: v for k, v in TEMPLATE_VALUES.items() if k in template_variables(text)}
        jobs.append((MODULES / template, values))
        jobs.append((MODULES / template, {**values, **{k: "" for k in OPTIONAL[unit]}}))
    rendered = render_with_terraform(jobs)
    for (path, values), by_terraform in zip(jobs, rendered):
        assert render(path.read_text(), values) == by_terraform, path


def test_aws_actor_script_stops_actor_on_spot_interruption_notice():
    script = render((MODULES / "aws-actors/templates/actor-user-data.sh.tftpl").read_text(), TEMPLATE_VALUES)
    watcher = re.search(r"cat > /usr/local/sbin/aurora-spot-watch <<'WATCH'\n(.*?)\nWATCH\n", script, re.S)
    assert watcher, "no spot interruption watcher"
    body = watcher.group(1)
    assert 'curl -sf -m 2 -X PUT "$imds/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300"' in body  # IMDSv2
    assert "imds=http://169.254.169.254/latest" in body and '"$imds/meta-data/spot/instance-action"' in body
    assert '-H "X-aws-ec2-metadata-token: $token"' in body and '-w "%{http_code}"' in body
    assert "systemctl stop aurora-actor.service" in body
    watch_unit = unit_section(script, "aurora-spot-watch")
    assert "ExecStart=/usr/local/sbin/aurora-spot-watch" in watch_unit
    assert "systemctl enable --now aurora-actor.service aurora-spot-watch.service" in script


def test_gcp_actor_shutdown_script_sends_sigterm():
    shutdown = (MODULES / "gcp-actors/templates/actor-shutdown.sh").read_text()
    assert shutdown.startswith("#!/bin/bash\n") and "\nsystemctl stop aurora-actor.service\n" in shutdown
    body = unit_section(render((MODULES / "gcp-actors/templates/actor-startup.sh.tftpl").read_text(),
                               TEMPLATE_VALUES), "aurora-actor")
    assert_stops_with_sigterm(body)


# --- the AWS root, planned offline -----------------------------------------------------------------------------


def _changes(plan: dict, type_: str) -> dict[str, dict]:
    return {rc["address"]: rc["change"]["after"] for rc in plan["resource_changes"] if rc["type"] == type_}


def test_aws_plan_renders_startup_commands_per_region(aws_plan):
    outputs = aws_plan["planned_values"]["outputs"]
    home, remotes = "us-east-1", ["eu-west-1", "ap-southeast-2"]
    urls = outputs["bucket_urls"]["value"]
    assert urls == {r: f"s3://aurora-demo-{r}/demo?region={r}" for r in [home, *remotes]}
    assert outputs["home_bucket_url"]["value"] == urls[home]
    assert outputs["redis_url"]["sensitive"] is True

    actors = outputs["actor_user_data"]["value"]
    relays = outputs["relay_user_data"]["value"]
    assert set(actors) == {home, *remotes} and set(relays) == set(remotes)  # no relay in the home region
    for region, script in actors.items():
        argv, body = exec_argv(script, "aurora-actor")
        assert_stops_with_sigterm(body)
        config = parse_worker(argv, "workers.actor")
        assert (config.bucket, config.redis, config.region, config.run) == (urls[region], REDIS_URL, region, "demo")
        assert config.source_bucket == (None if region == home else urls[home])
        assert (config.engine, config.trainer_public_key, config.metrics_port) == ("vllm", PUBLIC_KEY, 9400)
        assert 'REDIS_URL="$(retry read_parameter "/aurora/demo/redis-url/actor")"' in script  # its role's URL
        assert 'CACHE_TOKEN="$(retry read_parameter "/aurora/demo/cache-token")"' in script
        assert 'region_name="us-east-1"' in script and "redis-url/relay" not in script
        assert "'aurora-rl[rl] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl' 'vllm==0.10.1'" in script
        assert "rediss://" not in script and PLAN_VARS["redis_auth_token"] not in script  # no secret in user data
    for region, script in relays.items():
        argv, body = exec_argv(script, "aurora-relay")
        config = parse_worker(argv, "workers.relay")
        assert (config.source, config.dest) == (urls[home], urls[region])
        assert (config.redis, config.region) == (REDIS_URL, region)
        assert 'REDIS_URL="$(retry read_parameter "/aurora/demo/redis-url/relay")"' in script
        assert 'CACHE_TOKEN="$(retry read_parameter "/aurora/demo/cache-token")"' in script
        assert "rediss://" not in script and "redis-url/actor" not in script

    # What the launch templates carry is exactly these scripts (the trainer's is on its instance).
    templates = _changes(aws_plan, "aws_launch_template").values()
    user_data = {base64.b64decode(after["user_data"]).decode() for after in templates if after.get("user_data")}
    assert user_data == set(actors.values()) | set(relays.values())


def test_aws_plan_trainer_on_demand_with_checkpoint_volume_secret_and_private_metrics(aws_plan):
    outputs = aws_plan["planned_values"]["outputs"]
    home_url = outputs["home_bucket_url"]["value"]
    script = outputs["trainer_user_data"]["value"]
    argv, body = exec_argv(script, "aurora-trainer")
    assert_stops_with_sigterm(body)
    launch, config = parse_trainer(argv)
    assert launch.nproc_per_node == "8"  # trainer_gpus: one rank per GPU
    assert (config.bucket, config.redis, config.region, config.run) == (home_url, REDIS_URL, "us-east-1", "demo")
    assert (config.steps, config.model, config.metrics_port) == (2000, "/var/lib/aurora-trainer/model", 9400)
    assert config.signing_key == "/run/aurora-trainer/signing-key"
    assert "'aurora-rl[rl] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl' 'vllm==0.10.1'" in script
    assert "rediss://" not in script and PLAN_VARS["redis_auth_token"] not in script  # no secret in user data
    assert 'get_secret_value(SecretId="aurora/demo/trainer-signing-key")' in script  # fetched at every start
    assert 'ssm.get_parameter(Name="/aurora/demo/redis-url/trainer"' in script  # the trainer user's URL

    (instance,) = _changes(aws_plan, "aws_instance").values()
    assert instance["instance_type"] == "p5.48xlarge" and not instance.get("instance_market_options")  # on-demand
    assert instance["user_data"] in (script, hashlib.sha1(script.encode()).hexdigest())  # state keeps a hash
    assert instance["user_data_replace_on_change"] is True
    assert instance["metadata_options"][0]["instance_metadata_tags"] == "enabled"  # the volume tag, via IMDSv2
    assert instance["metadata_options"][0]["http_tokens"] == "required"
    assert "meta-data/tags/instance/$1" in script and "imds_tag aurora-checkpoint-volume" in script
    (volume,) = _changes(aws_plan, "aws_ebs_volume").values()
    assert (volume["size"], volume["encrypted"], volume["availability_zone"]) == (2000, True, "us-east-1a")
    (attachment,) = _changes(aws_plan, "aws_volume_attachment").values()
    assert attachment["stop_instance_before_detaching"] is True
    secrets = {s["name"] for s in _changes(aws_plan, "aws_secretsmanager_secret").values()}
    assert secrets == {"aurora/demo/trainer-signing-key", "aurora/demo/admission-secret"}
    types = {rc["type"] for rc in aws_plan["resource_changes"]}
    assert "aws_secretsmanager_secret_version" not in types  # neither value ever enters Terraform's state
    assert 'get_secret_value(SecretId="aurora/demo/admission-secret")' in script  # read at boot, not user data
    metrics = {a: r for a, r in _changes(aws_plan, "aws_vpc_security_group_ingress_rule").items()
               if a.startswith("module.trainer.")}
    assert [(r["cidr_ipv4"], r["from_port"], r["to_port"]) for r in metrics.values()] == [("10.64.0.0/16", 9400, 9400)]


def test_aws_trainer_role_reads_only_its_signing_key_and_the_admission_secret():
    found = [s for s in statements(_aws_policy_documents()["aws/trainer"])
             if any(a.startswith("secretsmanager:") for a in s["actions"])]
    assert all(s["actions"] == ["secretsmanager:GetSecretValue"] for s in found)
    assert sorted(r for s in found for r in s["resources"]) == [
        "${aws_secretsmanager_secret.admission.arn}", "${module.trainer.signing_key_secret_arn}"]


def test_aws_remote_region_slots_agree():
    """The documented way to add a remote region: one provider alias, one module block, the validation's limit,
    the list of remotes — all must name the same slots (infra/terraform/README.md)."""
    root = TF / "aws"
    providers = (root / "providers.tf").read_text()
    main = (root / "main.tf").read_text()
    aliases = remote_slots()
    modules = re.findall(r'^module "(remote\d+)"', main, re.M)
    slots = [f"remote{i}" for i in range(1, len(aliases) + 1)]
    assert aliases == modules == slots
    assert f"remotes     = concat({', '.join(f'module.{m}' for m in slots)})" in main
    assert f"for i in range({len(slots)})" in main
    assert f"length(var.remote_regions) <= {len(slots)}" in (root / "variables.tf").read_text()
    for i, slot in enumerate(slots):
        assert f'providers          = {{ aws = aws.{slot}, aws.home = aws }}' in main
        assert f"local.remote_slots[{i}]" in providers


def test_aws_plan_actors_spot_relays_on_demand(aws_plan):
    groups = _changes(aws_plan, "aws_autoscaling_group")
    actor_groups = {a: g for a, g in groups.items() if a.endswith("aws_autoscaling_group.actor")}
    relay_groups = {a: g for a, g in groups.items() if a.endswith("aws_autoscaling_group.relay")}
    assert len(actor_groups) == 3 and len(relay_groups) == 2
    for group in actor_groups.values():
        distribution = group["mixed_instances_policy"][0]["instances_distribution"][0]
        assert distribution["on_demand_base_capacity"] == 0
        assert distribution["on_demand_percentage_above_base_capacity"] == 0
        assert group["capacity_rebalance"] is True
    for group in relay_groups.values():
        assert not group.get("mixed_instances_policy") and (group["min_size"], group["max_size"]) == (1, 1)
    for template in _changes(aws_plan, "aws_launch_template").values():
        assert template["metadata_options"][0]["http_tokens"] == "required"
        assert template["block_device_mappings"][0]["ebs"][0]["encrypted"] == "true"


def test_aws_plan_redis_tls_auth_and_private(aws_plan):
    (group,) = _changes(aws_plan, "aws_elasticache_replication_group").values()
    assert group["transit_encryption_enabled"] is True and group["transit_encryption_mode"] == "required"
    assert str(group["at_rest_encryption_enabled"]).lower() == "true"
    assert not group.get("auth_token"), "RBAC users replace the AUTH token (ElastiCache takes one or the other)"
    assert group["user_group_ids"] == ["aurora-demo-users"]
    assert group["engine"] == "valkey" and int(group["engine_version"].split(".")[0]) >= 7  # %R~ / %W~ selectors
    parameters = {p["name"]: p for p in _changes(aws_plan, "aws_ssm_parameter").values()}
    assert set(parameters) == {"/aurora/demo/redis-url/trainer", "/aurora/demo/redis-url/relay",
                               "/aurora/demo/redis-url/actor", "/aurora/demo/cache-token"}
    assert all(p["type"] == "SecureString" for p in parameters.values())
    rules = {a: r for a, r in _changes(aws_plan, "aws_vpc_security_group_ingress_rule").items() if ".redis." in a}
    assert rules and all(r["from_port"] == r["to_port"] == 6379 and r["ip_protocol"] == "tcp" for r in rules.values())
    cidrs = sorted(r["cidr_ipv4"] for r in rules.values() if r.get("cidr_ipv4"))
    assert cidrs == ["10.65.0.0/16", "10.66.0.0/16"]  # the peered remote VPCs, nothing wider
    assert sorted(a.split('"')[1] for a in rules if "from_security_groups" in a) == ["actors", "trainer"]
    vpcs = sorted(v["cidr_block"] for v in _changes(aws_plan, "aws_vpc").values())
    assert vpcs == ["10.64.0.0/16", "10.65.0.0/16", "10.66.0.0/16"]
    assert len(_changes(aws_plan, "aws_vpc_peering_connection")) == 2


# --- AWS policies (HCL) ----------------------------------------------------------------------------------------


def test_aws_bucket_policy_requires_if_none_match_and_reserves_deletes():
    doc = hcl_dir(MODULES / "aws-bucket")
    keys = named(doc, "locals")
    assert all(p in keys["create_only_keys"] for p in ('"deltas/*"', '"snapshots/*/manifest.json"'))
    assert "${local.bucket_arn}/*/${pattern}" in keys["create_only_keys"]  # also under the run prefix
    policy = typed(doc, "data", "aws_iam_policy_document")["bucket"]
    by_sid = {s["sid"]: s for s in statements(policy)}
    assert all(s["effect"] == "Deny" for s in by_sid.values())

    overwrite = by_sid["DenyOverwriteOfPublishedVersions"]
    assert overwrite["actions"] == ["s3:PutObject"] and overwrite["resources"] == "${local.create_only_keys}"
    assert overwrite["principals"] == [{"type": "*", "identifiers": ["*"]}]
    assert {"test": "Null", "variable": "s3:if-none-match", "values": ["true"]} in overwrite["condition"]

    delete = by_sid["DenyDeleteOfVersionDataExceptGC"]
    assert set(delete["actions"]) == {"s3:DeleteObject", "s3:DeleteObjectVersion"}
    assert all(p in keys["version_data_keys"] for p in ('"deltas/*"', '"snapshots/*"', '"segments/*"'))
    (exception,) = [c["condition"]["content"][0] for c in delete["dynamic"]]
    assert exception == {"test": "ArnNotEquals", "variable": "aws:PrincipalArn", "values": "${var.gc_role_arns}"}
    assert by_sid["DenyInsecureTransport"]["condition"][0]["variable"] == "aws:SecureTransport"
    root = hcl_dir(TF / "aws")
    assert named(root, "module")["home_bucket"]["gc_role_arns"] == ["${aws_iam_role.gc.arn}"]
    assert named(root, "locals")["common"]["gc_role_arns"] == ["${aws_iam_role.gc.arn}"]  # remote buckets


def test_aws_bucket_never_expires_live_objects_and_is_private():
    doc = hcl_dir(MODULES / "aws-bucket")
    (lifecycle,) = typed(doc, "resource", "aws_s3_bucket_lifecycle_configuration").values()
    for expiration in walk(lifecycle, "expiration"):
        assert expiration == [{"expired_object_delete_marker": True}], "live objects must never expire: aurora gc"
    assert list(walk(lifecycle, "abort_incomplete_multipart_upload"))
    assert list(walk(lifecycle, "noncurrent_version_expiration"))
    for forbidden in ("transition", "noncurrent_version_transition"):
        assert not list(walk(lifecycle, forbidden))
    (access,) = typed(doc, "resource", "aws_s3_bucket_public_access_block").values()
    assert all(access[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                           "restrict_public_buckets"))
    (encryption,) = typed(doc, "resource", "aws_s3_bucket_server_side_encryption_configuration").values()
    assert next(walk(encryption, "sse_algorithm")) in ("AES256", "aws:kms")
    assert "aurora gc" in (MODULES / "aws-bucket/main.tf").read_text()


def _aws_policy_documents() -> dict[str, dict]:
    documents = {}
    for root in [TF / "aws", *sorted(MODULES.glob("aws-*"))]:
        doc = hcl_dir(root)
        for name, document in typed(doc, "data", "aws_iam_policy_document").items():
            documents[f"{root.name}/{name}"] = document
        assert not typed(doc, "resource", "aws_iam_role_policy_attachment"), "no managed policies"
        assert not typed(doc, "resource", "aws_iam_policy_attachment"), "no managed policies"
        for role in typed(doc, "resource", "aws_iam_role").values():
            assert "managed_policy_arns" not in role and "inline_policy" not in role
    return documents


def _allowed_actions(document: dict) -> list[tuple[str, dict]]:
    return [(action, s) for s in statements(document) if s.get("effect", "Allow") == "Allow" for action in s["actions"]]


def test_aws_no_worker_role_may_delete():
    documents = _aws_policy_documents()
    workers = {"aws-actors/actor", "aws-relay/relay", "aws/trainer"}
    assert workers <= set(documents) and "aws/gc" in documents and "aws-bucket/bucket" in documents
    for name, document in documents.items():
        if name in ("aws/gc", "aws-bucket/bucket"):
            continue
        for action, _ in _allowed_actions(document):
            granted = [d for d in S3_DELETE_ACTIONS if fnmatch.fnmatchcase(d, action)]
            assert not granted, f"{name} grants {granted} via {action!r}"
    gc_actions = {a for a, _ in _allowed_actions(documents["aws/gc"])}
    assert "s3:DeleteObject" in gc_actions and "s3:PutObject" not in gc_actions
    assert all(s.get("effect") == "Deny" for s in statements(documents["aws-bucket/bucket"]))


def test_aws_roles_least_privilege():
    documents = _aws_policy_documents()
    actor = {a for a, _ in _allowed_actions(documents["aws-actors/actor"])}
    assert actor == {"s3:ListBucket", "s3:GetObject", "ssm:GetParameter", "secretsmanager:GetSecretValue"}  # read-only
    for action, statement in _allowed_actions(documents["aws-actors/actor"]):
        if action.startswith("secretsmanager:"):
            assert statement["resources"] == ["${var.admission_secret_arn}"], "actors read the admission secret only"
    for action, statement in _allowed_actions(documents["aws-relay/relay"]):
        if action in ("s3:PutObject", "s3:AbortMultipartUpload"):
            assert statement["resources"] == ["${var.bucket_arn}/*"], "relays write only their regional bucket"
    for action, statement in _allowed_actions(documents["aws/trainer"]):
        if action == "s3:PutObject":
            assert statement["resources"] == ["${module.home_bucket.arn}/*"], "the trainer writes only its home bucket"
    for name, document in documents.items():
        for action, statement in _allowed_actions(document):
            assert "*" not in action, f"{name}: wildcard action {action}"
            if action.startswith("ssm:"):
                assert statement["resources"] in (["${var.redis_parameter_arn}"], ["${var.cache_token_arn}"],
                                                  ['${module.redis.url_parameter_arns["trainer"]}']), name


def test_aws_redis_module_tls_and_per_role_users():
    doc = hcl_dir(MODULES / "aws-redis")
    (group,) = typed(doc, "resource", "aws_elasticache_replication_group").values()
    assert group["transit_encryption_enabled"] is True and group["at_rest_encryption_enabled"] is True
    assert group["transit_encryption_mode"] == "required"
    assert "auth_token" not in group and group["user_group_ids"] == ["${aws_elasticache_user_group.this.user_group_id}"]
    users = typed(doc, "resource", "aws_elasticache_user")
    assert set(users) == {"default", "operator", "role"}
    # A user group must hold a user named "default": here it is off, with no command, key or channel.
    assert users["default"]["user_name"] == "default" and users["default"]["access_string"] == "off -@all"
    assert users["default"]["user_id"] != "default"
    assert users["operator"]["user_name"] == "operator"
    assert users["role"]["for_each"] == "${toset(local.roles)}" and users["role"]["user_name"] == "${each.key}"
    assert users["role"]["access_string"] == "${local.access_strings[each.key]}"
    for user in users.values():
        (auth,) = user["authentication_mode"]
        assert auth["type"] == "password" and "access_string" in user
    (user_group,) = typed(doc, "resource", "aws_elasticache_user_group").values()
    for name in ("default", "operator"):
        assert f"aws_elasticache_user.{name}.user_id" in user_group["user_ids"]
    assert "aws_elasticache_user.role[role].user_id" in user_group["user_ids"]
    locals_ = named(doc, "locals")
    assert locals_["roles"] == ["trainer", "relay", "actor"]
    assert "rediss://${user}:${local.passwords[user]}@" in locals_["urls"] and "operator" in locals_["urls"]
    (parameter,) = typed(doc, "resource", "aws_ssm_parameter")["url"],
    assert parameter["for_each"] == "${toset(local.roles)}" and parameter["type"] == "SecureString"
    assert parameter["value"] == "${local.urls[each.key]}"  # role URLs only: the operator's is an output
    outputs = named(doc, "output")
    assert outputs["url"]["sensitive"] is True and outputs["url"]["value"] == '${local.urls["operator"]}'
    assert outputs["role_urls"]["sensitive"] is True
    assert named(hcl_dir(TF / "aws"), "output")["redis_url"]["sensitive"] is True
    (validation,) = named(doc, "variable")["engine_version"]["validation"]
    assert ">= 7" in validation["condition"]  # %R~ / %W~ key selectors


def test_aws_redis_access_strings_are_acl_rules():
    """The users' access strings in Terraform are aurora_store.bus.acl's rules, rendered by access_string()."""
    from aurora_store.bus import acl

    path = REPO / acl.TERRAFORM_FILE
    assert path.read_text() == acl.terraform_access_strings(), \
        f"regenerate it: python -m aurora_store.bus.acl > {acl.TERRAFORM_FILE}"
    templates = named(load_hcl(path), "locals")["access_string_templates"]
    assert set(templates) == set(acl.ROLES)
    for role in acl.ROLES:
        assert templates[role].replace(acl.TERRAFORM_RUN, "demo") == acl.access_string(role, "demo")
        assert templates[role].split() == ["on", *(r for r in acl.rules(role, acl.TERRAFORM_RUN)
                                                   if not r.startswith("reset"))]


def test_aws_plan_redis_users_carry_acl_rules(aws_plan):
    from aurora_store.bus import acl

    users = {u["user_name"]: u for u in _changes(aws_plan, "aws_elasticache_user").values()}
    assert set(users) == {"default", "operator", *acl.ROLES}
    for role in acl.ROLES:
        assert users[role]["access_string"] == acl.access_string(role, "demo")
        assert users[role]["user_id"] == f"aurora-demo-{role}"
    assert users["default"]["access_string"] == "off -@all" and users["default"]["user_id"] == "aurora-demo-default"
    assert users["operator"]["access_string"] == "on ~* &* +@all"
    (group,) = _changes(aws_plan, "aws_elasticache_user_group").values()
    assert group["user_group_id"] == "aurora-demo-users"
    assert sorted(group["user_ids"]) == sorted(u["user_id"] for u in users.values())


def test_aws_each_role_reads_only_its_own_redis_url():
    """trainer: the trainer user's URL; relays: the relay user's; actors: the actor user's (plus, for relays and
    actors, the shared cache token); every module is wired to its role's parameter."""
    documents = _aws_policy_documents()

    def ssm_resources(name):
        return sorted(r for a, s in _allowed_actions(documents[name]) if a.startswith("ssm:") for r in s["resources"])

    assert ssm_resources("aws/trainer") == ['${module.redis.url_parameter_arns["trainer"]}']
    for name in ("aws-actors/actor", "aws-relay/relay"):
        assert ssm_resources(name) == ["${var.cache_token_arn}", "${var.redis_parameter_arn}"]
    root = hcl_dir(TF / "aws")
    modules, common = named(root, "module"), named(root, "locals")["common"]
    assert modules["trainer"]["redis_parameter_name"] == '${module.redis.url_parameter_names["trainer"]}'
    assert modules["home_actors"]["redis_parameter_name"] == '${module.redis.url_parameter_names["actor"]}'
    assert modules["home_actors"]["redis_parameter_arn"] == '${module.redis.url_parameter_arns["actor"]}'
    assert common["actor_redis_parameter"] == '${module.redis.url_parameter_names["actor"]}'
    assert common["actor_redis_arn"] == '${module.redis.url_parameter_arns["actor"]}'
    assert common["relay_redis_parameter"] == '${module.redis.url_parameter_names["relay"]}'
    assert common["relay_redis_arn"] == '${module.redis.url_parameter_arns["relay"]}'
    remote = named(hcl_dir(MODULES / "aws-remote-region"), "module")
    assert remote["actors"]["redis_parameter_arn"] == "${local.c.actor_redis_arn}"
    assert remote["relay"]["redis_parameter_arn"] == "${local.c.relay_redis_arn}"
    for module in (remote["actors"], remote["relay"], modules["home_actors"]):
        assert module["cache_token_arn"] in ("${local.c.cache_token_arn}", "${module.redis.cache_token_parameter_arn}")


# --- GCP contract (HCL) ------------------------------------------------------------------------------------------


def test_gcp_root_variables_and_outputs():
    doc = hcl_dir(TF / "gcp")
    variables = named(doc, "variable")
    expected = {"project_id", "run", "home_region", "remote_regions", "package_spec", "extra_pip_packages", "model_url",
                "trainer_public_key", "engine", "metrics_port", "actor_count", "actor_count_by_region",
                "actor_machine_type", "actor_image", "relay_machine_type", "relay_image"}
    assert expected <= set(variables)
    required = {n for n, v in variables.items() if "default" not in v}
    assert required == {"project_id", "run", "home_region", "package_spec"}
    outputs = named(doc, "output")
    assert {"bucket_urls", "home_bucket_url", "redis_url", "redis_ca_cert"} <= set(outputs)
    assert outputs["redis_url"]["sensitive"] is True
    modules = named(doc, "module")
    assert modules["relay"]["for_each"] == "${local.remote_regions}"
    assert named(doc, "locals")["remote_regions"] == "${toset(var.remote_regions)}"
    assert modules["actors"]["for_each"] == modules["bucket"]["for_each"] == "${toset(local.regions)}"
    assert modules["relay"]["source_bucket_url"] == modules["actors"]["source_bucket_url"] == "${local.home_bucket.url}"
    assert named(doc, "locals")["home_bucket"] == "${module.bucket[var.home_region]}"
    assert named(hcl_dir(MODULES / "gcp-bucket"), "output")["url"]["value"] == "gs://${var.name}/${var.run}"


def test_gcp_actors_on_spot_with_sigterm_on_preemption():
    doc = hcl_dir(MODULES / "gcp-actors")
    (template,) = typed(doc, "resource", "google_compute_instance_template").values()
    (scheduling,) = template["scheduling"]
    assert scheduling["provisioning_model"] == "SPOT" and scheduling["preemptible"] is True
    assert scheduling["automatic_restart"] is False
    assert template["metadata"]["startup-script"] == "${local.startup_script}"
    assert template["metadata"]["shutdown-script"] == "${local.shutdown_script}"
    scripts = named(doc, "locals")
    assert "/templates/actor-startup.sh.tftpl" in scripts["startup_script"]
    assert scripts["shutdown_script"] == '${file("${path.module}/templates/actor-shutdown.sh")}'
    assert "network_interface" in template and "access_config" not in template["network_interface"][0]
    (group,) = typed(doc, "resource", "google_compute_region_instance_group_manager").values()
    assert group["version"][0]["instance_template"] == "${google_compute_instance_template.actor.id}"
    assert group["target_size"] == "${var.desired_count}"
    startup = (MODULES / "gcp-actors/templates/actor-startup.sh.tftpl").read_text()
    assert "python -m workers.actor --bucket ${bucket_url} --redis $${AURORA_REDIS_URL} --region ${region}" in startup
    (relay_template,) = typed(hcl_dir(MODULES / "gcp-relay"), "resource", "google_compute_instance_template").values()
    assert relay_template["scheduling"][0]["provisioning_model"] == "STANDARD"


def test_gcp_trainer_on_demand_with_checkpoint_disk_secret_and_private_metrics():
    doc = hcl_dir(MODULES / "gcp-trainer")
    (vm,) = typed(doc, "resource", "google_compute_instance").values()
    (scheduling,) = vm["scheduling"]
    assert scheduling["provisioning_model"] == "STANDARD" and scheduling["preemptible"] is False  # never Spot
    assert scheduling["on_host_maintenance"] == "TERMINATE"  # GPU VMs cannot live-migrate
    assert vm["metadata"]["startup-script"] == "${local.startup_script}"
    assert vm["metadata"]["shutdown-script"] == "#!/bin/bash\nsystemctl stop aurora-trainer.service\n"
    assert "access_config" not in vm["network_interface"][0]  # no external address
    (disk,) = vm["attached_disk"]
    assert disk == {"source": "${google_compute_disk.data.id}", "device_name": "${local.disk_device}"}
    assert named(doc, "locals")["disk_device"] == "aurora-ckpt"
    assert "/templates/trainer-startup.sh.tftpl" in named(doc, "locals")["startup_script"]
    assert not typed(doc, "resource", "google_secret_manager_secret_version")  # the key's value is not in state
    (grant,) = typed(doc, "resource", "google_secret_manager_secret_iam_member").values()
    assert grant["role"] == "roles/secretmanager.secretAccessor"
    assert grant["secret_id"] == "${google_secret_manager_secret.signing_key.id}"
    (firewall,) = typed(doc, "resource", "google_compute_firewall").values()
    assert firewall["source_ranges"] == "${var.metrics_cidrs}" and firewall["target_tags"] == vm["tags"]
    trainer = named(hcl_dir(TF / "gcp"), "module")["trainer"]
    assert trainer["metrics_cidrs"] == "${[for region in local.regions : local.subnets[region]]}"  # the run's VPC
    assert trainer["service_account_member"] == "${google_service_account.trainer.member}"
    assert trainer["bucket_url"] == "${local.home_bucket.url}"
    assert {"trainer_instance", "trainer_signing_key_secret"} <= set(named(hcl_dir(TF / "gcp"), "output"))


def test_gcp_memorystore_auth_and_tls():
    doc = hcl_dir(MODULES / "gcp-redis")
    (redis,) = typed(doc, "resource", "google_redis_instance").values()
    assert redis["auth_enabled"] is True
    assert redis["transit_encryption_mode"] == "SERVER_AUTHENTICATION"
    assert redis["authorized_network"] == "${var.network_id}"
    assert named(doc, "locals")["base_url"].startswith("rediss://:${google_redis_instance.this.auth_string}@")
    assert named(doc, "output")["url"]["sensitive"] is True


def test_gcp_bucket_private_versioned_never_deletes_live_objects():
    doc = hcl_dir(MODULES / "gcp-bucket")
    (bucket,) = typed(doc, "resource", "google_storage_bucket").values()
    assert bucket["uniform_bucket_level_access"] is True and bucket["public_access_prevention"] == "enforced"
    assert bucket["versioning"] == [{"enabled": True}]
    types = []
    for rule in bucket["lifecycle_rule"]:
        (action,), (condition,) = rule["action"], rule["condition"]
        types.append(action["type"])
        if action["type"] == "Delete":
            assert condition["with_state"] == "ARCHIVED" and "days_since_noncurrent_time" in condition
            assert "age" not in condition
    assert sorted(types) == ["AbortIncompleteMultipartUpload", "Delete"]
    condition = named(doc, "output")["rewritable_objects_condition"]["value"]
    assert "deltas" not in condition and "layouts" not in condition
    assert '!resource.name.endsWith(\\"/manifest.json\\")' in condition


def test_gcp_service_accounts_least_privilege():
    allowed = {"roles/storage.objectViewer", "roles/storage.objectCreator", "roles/storage.objectUser"}
    bindings = {}
    for root in (TF / "gcp", MODULES / "gcp-actors", MODULES / "gcp-relay"):
        doc = hcl_dir(root)
        assert not typed(doc, "resource", "google_project_iam_member"), "no project-wide grants"
        assert not typed(doc, "resource", "google_project_iam_binding"), "no project-wide grants"
        for name, binding in typed(doc, "resource", "google_storage_bucket_iam_member").items():
            bindings[f"{root.name}/{name}"] = binding
    assert all(b["role"] in allowed for b in bindings.values())
    actor = {n: b for n, b in bindings.items() if n.startswith("gcp-actors/")}
    assert actor and all(b["role"] == "roles/storage.objectViewer" for b in actor.values())
    # objectUser (overwrite/delete) only under the rewritable-objects condition, except for the GC account.
    for name, binding in bindings.items():
        if binding["role"] == "roles/storage.objectUser" and name != "gcp/gc":
            (condition,) = binding["condition"]
            assert "rewritable_objects_condition" in condition["expression"] or \
                condition["expression"] == "${var.bucket_rewritable_condition}"
    assert bindings["gcp/gc"]["member"] == "${google_service_account.gc.member}"
    relay = {b["role"] for n, b in bindings.items() if n.startswith("gcp-relay/")}
    assert relay == allowed
    assert bindings["gcp-relay/create"]["bucket"] == "${var.bucket_name}"  # writes only its regional bucket


# --- apply of the bucket module against a real S3-compatible server ----------------------------------------------

APPLY_ROOT = """
terraform {{
  required_providers {{
    aws = {{
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }}
  }}
}}

provider "aws" {{
  region                      = "us-east-1"
  access_key                  = "{access_key}"
  secret_key                  = "{secret_key}"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
  s3_use_path_style           = true
  endpoints {{
    s3 = "{endpoint}"
  }}
}}

module "bucket" {{
  source        = "./aws-bucket"
  name          = "{bucket}"
  region        = "us-east-1"
  run           = "demo"
  force_destroy = true
}}

output "url" {{
  value = module.bucket.url
}}
"""

# The local server speaks plain HTTP and lacks PutPublicAccessBlock (501), and waiting for its lifecycle
# configuration to read back takes about a minute: for this test only, the public access block is dropped,
# the policy's DenyInsecureTransport statement is filtered out (it would deny every plain-HTTP request, as it
# should), and the lifecycle rules are not applied (-target). Every other statement is the module's own.
APPLY_OVERRIDE = """
resource "aws_s3_bucket_public_access_block" "this" {
  count = 0
}

resource "aws_s3_bucket_policy" "this" {
  policy = jsonencode(merge(jsondecode(data.aws_iam_policy_document.bucket.json), {
    Statement = [
      for s in jsondecode(data.aws_iam_policy_document.bucket.json).Statement : s if s.Sid != "DenyInsecureTransport"
    ]
  }))
}
"""


@pytest.mark.s3
def test_bucket_module_applies_and_enforces_immutability(s3_server):
    if TERRAFORM is None:
        pytest.skip("terraform is not on PATH")
    plugins = aws_plugin_dir()
    if plugins is None:
        pytest.skip("no local hashicorp/aws 5.x provider plugin found: cannot run terraform init offline")
    from aurora_store.errors import ObjectExistsError, StoreAuthError
    from aurora_store.store.url import open_bucket

    client = s3_server.client()
    enforces_policies, evaluates_if_none_match = _policy_support(client)
    if not enforces_policies:
        pytest.skip("the local S3 server does not enforce bucket policies")
    bucket = f"aurora-tf-{uuid.uuid4().hex[:12]}"
    workdir = Path(tempfile.mkdtemp(prefix="aurora-tf-apply-"))
    try:
        env = tf_env(workdir)
        shutil.copytree(MODULES / "aws-bucket", workdir / "aws-bucket")
        (workdir / "aws-bucket" / "zz_test_override.tf").write_text(APPLY_OVERRIDE)
        (workdir / "main.tf").write_text(APPLY_ROOT.format(access_key=s3_server.access_key,
                                                           secret_key=s3_server.secret_key,
                                                           endpoint=s3_server.endpoint_url, bucket=bucket))
        terraform(["init", "-backend=false", "-input=false", f"-plugin-dir={plugins}", "-no-color"], workdir, env)
        targets = [f"-target=module.bucket.{r}" for r in (
            "aws_s3_bucket_policy.this", "aws_s3_bucket_versioning.this",
            "aws_s3_bucket_server_side_encryption_configuration.this", "aws_s3_bucket_ownership_controls.this")]
        terraform(["apply", "-auto-approve", "-input=false", "-no-color", *targets], workdir, env, timeout=240)
        url = json.loads(terraform(["output", "-json", "url"], workdir, env).stdout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    assert url == f"s3://{bucket}/demo?region=us-east-1"
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rules = client.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    ownership = client.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert ownership == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    policy = json.loads(client.get_bucket_policy(Bucket=bucket)["Policy"])
    assert {s["Sid"] for s in policy["Statement"]} == {"DenyOverwriteOfPublishedVersions",
                                                        "DenyDeleteOfVersionDataExceptGC"}

    # Aurora's own S3 backend against the policy: overwrites and deletes of published versions are refused.
    store = open_bucket(f"{url}&endpoint_url={s3_server.endpoint_url}")
    if evaluates_if_none_match:
        store.create("deltas/000000000001.json", b"{}")
        with pytest.raises(ObjectExistsError):
            store.create("deltas/000000000001.json", b"{}")
        store.create("snapshots/000000000002/manifest.json", b"{}")
    # Otherwise (SeaweedFS 4.x) the server leaves s3:if-none-match out of its policy context and so refuses even
    # conditional writes to these keys; the create path is then only checked on the HCL (and on AWS).
    for key in ("deltas/000000000002.json", "snapshots/000000000002/manifest.json", "layouts/abc.json"):
        with pytest.raises(StoreAuthError):
            store.put(key, b"{}")  # no If-None-Match: refused by the bucket policy
    with pytest.raises(client.exceptions.ClientError, match="AccessDenied"):
        client.put_object(Bucket=bucket, Key="deltas/000000000003.json", Body=b"{}")  # without the run prefix too
    segment = "segments/ab/" + "ab" * 32
    for _ in range(2):  # content-addressed objects and pointers may be rewritten
        store.put(segment, b"payload")
        store.put("snapshots/000000000002/model.safetensors", b"tensors")
        store.put("latest.json", b'{"version": 2}')
    for key in ("deltas/000000000001.json", segment, "snapshots/000000000002/model.safetensors"):
        with pytest.raises(StoreAuthError):
            store.delete(key)  # only the GC role may delete version data (none is configured here)
    store.delete("latest.json")
    assert store.get(segment) == b"payload"


def _policy_support(client) -> tuple[bool, bool]:
    """Whether the server enforces bucket policies, and whether it puts s3:if-none-match into its policy context
    (AWS does both; SeaweedFS 4.x only the first)."""
    probe = f"aurora-probe-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=probe)
    client.put_bucket_policy(Bucket=probe, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{probe}/*",
        "Condition": {"Null": {"s3:if-none-match": "true"}}}]}))
    outcomes = []
    for headers in ({}, {"IfNoneMatch": "*"}):
        try:
            client.put_object(Bucket=probe, Key=f"probe-{len(outcomes)}", Body=b"", **headers)
            outcomes.append(True)
        except client.exceptions.ClientError:
            outcomes.append(False)
    unconditional_allowed, conditional_allowed = outcomes
    return not unconditional_allowed, conditional_allowed


# --- docs/DEPLOY.md: every command and setting it shows is one these checks run ----------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_deploy_tfvars_set_declared_variables(cloud):
    variables = named(hcl_dir(TF / cloud), "variable")
    example = deploy_tfvars()[cloud]
    assert set(example) <= set(variables), f"undeclared: {sorted(set(example) - set(variables))}"
    required = {name for name, v in variables.items() if "default" not in v} - {"redis_auth_token"}
    assert required <= set(example), f"the walkthrough lacks {sorted(required - set(example))}"
    if "redis_auth_token" in variables:
        assert 'export TF_VAR_redis_auth_token="$(openssl rand -hex 32)"' in DEPLOY.read_text()


def test_deploy_aws_tfvars_plan_offline_and_start_the_trainer(aws_roots):
    plan = aws_roots.deploy_plan.result(timeout=300)
    outputs = plan["planned_values"]["outputs"]
    home = outputs["home_bucket_url"]["value"]
    assert home == "s3://acme-aurora-grpo-1-us-east-1/grpo-1?region=us-east-1"
    assert f'location("{home}")' in DEPLOY.read_text()  # the pandas example reads this very bucket
    launch, config = parse_trainer(exec_argv(outputs["trainer_user_data"]["value"], "aurora-trainer")[0])
    assert launch.nproc_per_node == "4"  # trainer_gpus' default, for the default g6e.12xlarge
    assert (config.bucket, config.run, config.steps, config.metrics_port) == (home, "grpo-1", 2000, 9400)
    assert set(outputs["actor_user_data"]["value"]) == {"us-east-1", "eu-west-1"}
    (instance,) = _changes(plan, "aws_instance").values()
    assert instance["instance_type"] == "g6e.12xlarge"


def test_deploy_commands_are_the_ones_checked(tmp_path, monkeypatch):
    from aurora_store.cli import build_parser
    from aurora_store.trust import Signer, Verifier

    text = DEPLOY.read_text()
    outputs = {cloud: set(named(hcl_dir(TF / cloud), "output")) for cloud in ("aws", "gcp")}
    for name in re.findall(r"terraform output (?:-raw |-json )?(\w+)", text):
        assert name in outputs["aws"] | outputs["gcp"], f"DEPLOY.md reads an undeclared output {name}"
    for name in ("home_bucket_url", "redis_url", "trainer_signing_key_secret"):
        assert name in outputs["aws"] & outputs["gcp"], name
    variables = set(named(hcl_dir(TF / "aws"), "variable"))
    for name in re.findall(r"-var (\w+)=", text):
        assert name in variables, f"DEPLOY.md sets an undeclared variable {name}"
    for name in re.findall(r"`(\w+)`", text):  # settings named in the prose exist in one of the roots
        if name.startswith(("trainer_", "actor_", "force_destroy", "signing_key", "redis_allowed")):
            assert name in variables | set(named(hcl_dir(TF / "gcp"), "variable")), name

    commands = deploy_shell_commands()
    assert ["terraform", "init"] in commands and ["terraform", "apply"] in commands
    assert ["terraform", "destroy"] in commands
    aurora = [argv for argv in commands if argv[0] == "aurora"]
    assert {argv[1] for argv in aurora} >= {"keygen", "status", "log"}
    parser = build_parser()
    for argv in aurora:
        parser.parse_args([a.replace("$(", "").replace(")", "") for a in argv[1:]])
    # keygen as written: the private key file is what goes into the secret, the public one into the tfvars.
    monkeypatch.chdir(tmp_path)
    keygens = [argv for argv in aurora if argv[1] == "keygen"]
    assert keygens and all(k == keygens[0] for k in keygens), keygens  # every walkthrough makes the same keys
    keygen = keygens[0]
    from aurora_store.cli import main

    assert main(keygen[1:]) == 0
    assert "file://../../../keys/trainer.key" in text and "--data-file=../../../keys/trainer.key" in text
    Signer.load((tmp_path / "keys" / "trainer.key").read_text().strip())  # as the unit's fetcher writes it
    public = (tmp_path / "keys" / "trainer.pub").read_text().strip()
    Verifier.load(public)
    assert re.fullmatch(r"[A-Za-z0-9+/=]+", public)  # passes trainer_public_key's validation
    for cloud in ("aws", "gcp"):
        Verifier.load(deploy_tfvars()[cloud]["trainer_public_key"])
