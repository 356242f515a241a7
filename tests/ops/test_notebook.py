"""The delta-history notebook, executed headlessly, on the bucket of a short real run and on a bucket written
only by ``aurora diff``; plus the inspection helpers and verify/gc on the real run's buckets."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from safetensors.torch import save_file

from aurora_store.cli import main
from aurora_store.ops import inspect
from aurora_store.ops import notebook as nb
from aurora_store.ops.gc import collect_garbage
from aurora_store.ops.runlog import PREFIX, export_run_log, load_exported
from aurora_store.ops.verify import verify_bucket
from aurora_store.store import DeltaStore
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from tests.ops.helpers import LAYOUT, build_bucket
from workers.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.redis

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "delta_history.ipynb"
STEPS, BATCH = 4, 8
SECTIONS_WITH_FIGURES = 7  # sizes, density, heatmaps, publish, delivery, actors' versions, settlements


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A short run of the whole system (trainer, relay, two actors as processes); its run log exported."""
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("ops-run"), steps=STEPS, batch_size=BATCH, group_size=4,
                       actors={"us-east": 1, "eu-west": 1}, snapshot_every=2, run="ops-notebook",
                       trainer_args=["--warm-start-steps", "8"])
    with LocalCluster(spec) as cluster:
        summary = cluster.wait_trainer_done(timeout=240)
        final = summary["trainer_version"]
        cluster.wait_actors_on(final, 60)
        key = export_run_log(cluster.plane, cluster.store())
        yield {"cluster": cluster, "summary": summary, "export": key, "buckets": dict(cluster.buckets)}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel spec for exactly this interpreter (the venv's), found before any user-installed one."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "aurora-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "aurora (tests)", "language": "python"}))
    return root


def execute(bucket: str, kernel: Path, cwd: Path, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("JUPYTER_PATH", str(kernel))
    monkeypatch.setenv("AURORA_BUCKET", bucket)
    for name in ("AURORA_REDIS", "AURORA_RUN", "AURORA_RUNLOG"):
        monkeypatch.delenv(name, raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, kernel_name="aurora-test", timeout=120,
                   resources={"metadata": {"path": str(cwd)}}).execute()  # raises on any cell error
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> tuple[int, str]:
    images, text = 0, []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", output
            images += "image/png" in output.get("data", {})
            if output["output_type"] == "stream" and output["name"] == "stdout":
                text.append(output["text"])
    return images, "".join(text)


def test_the_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert max(len(c.source.splitlines()) for c in code) <= 5  # the logic lives in aurora_store.ops


@pytest.mark.slow
def test_notebook_on_a_real_run(real_run, kernel, tmp_path, monkeypatch):
    notebook = execute(real_run["buckets"]["us-east"], kernel, tmp_path, monkeypatch)
    images, text = outputs(notebook)
    assert images == SECTIONS_WITH_FIGURES, text
    assert "no data" not in text
    assert f"versions:   {STEPS} (1…{STEPS})" in text
    assert f"entries from {DeltaStore(real_run['buckets']['us-east']).url}/{PREFIX}" in text
    assert f"{STEPS * BATCH} of {STEPS * BATCH} rollouts accepted" in text


def test_notebook_on_a_bucket_written_by_aurora_diff(kernel, tmp_path, monkeypatch, capsys):
    states = [random_state(LAYOUT, 5)]
    for i in range(3):
        states.append(perturb(states[-1], 0.02, 50 + i))
    files = []
    for i, state in enumerate(states):
        files.append(tmp_path / f"step{i}.safetensors")
        save_file({k: v.contiguous() for k, v in state.items()}, str(files[-1]))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_QWEN3))
    bucket = str(tmp_path / "diff-bucket")
    for v in range(1, 4):
        assert main(["diff", str(files[v - 1]), str(files[v]), "--out", bucket, "--version", str(v),
                     "--base", str(v - 1), "--config", str(config)]) == 0
    capsys.readouterr()
    notebook = execute(bucket, kernel, tmp_path, monkeypatch)
    images, text = outputs(notebook)
    assert images == 4, text  # sizes, density, heatmaps, publish timings (aurora diff records history)
    assert text.count("no data: no run log") == 3  # delivery latency, actors' versions, settlements
    assert main(["verify", bucket, "--deep"]) == 0  # a chain rooted outside the bucket is not a gap
    capsys.readouterr()
    # without its history rows (e.g. an older bucket) the table comes from the manifests, without timings
    shutil.rmtree(Path(bucket) / "history")
    view = inspect.open_view(bucket)
    assert inspect.column(view.versions, "version") == [1, 2, 3]
    nb.show_publish_latency(view)
    nb.show_versions(view)
    out = capsys.readouterr().out
    assert out.startswith("no data: no history rows with timings")
    first_row = out.splitlines()[2].split()
    assert first_row[0] == "1" and first_row[7:10] == ["-", "-", "-"]  # encode_s, upload_s, publish_s


@pytest.mark.s3
def test_notebook_on_an_s3_bucket(s3_bucket_url, kernel, tmp_path, monkeypatch):
    """AURORA_BUCKET as an s3:// URL with an endpoint: every section, and pandas reading history/ through s3fs."""
    url = s3_bucket_url.replace("?", "/run-1?")
    build_bucket(url, versions=3, snapshots=(0,))
    notebook = execute(url, kernel, tmp_path, monkeypatch)  # credentials: the AWS_* environment (s3_server)
    images, text = outputs(notebook)
    assert images == 4, text  # sizes, density, heatmaps, publish timings (no run log in this bucket)
    bucket = s3_bucket_url.split("//")[1].split("?")[0]
    assert f"s3://{bucket}/run-1/history/ " in text
    (frame,) = [o for c in notebook.cells for o in c.get("outputs", []) if o["output_type"] == "execute_result"
                and "delta_bytes" in o["data"].get("text/plain", "")]
    first_columns = frame["data"]["text/plain"].split("\n\n")[0].splitlines()  # pandas wraps wide tables
    assert first_columns[0].split()[0] == "version"
    assert [line.split()[1] for line in first_columns[1:]] == ["1", "2", "3"]


@pytest.mark.slow
def test_inspection_data_of_a_real_run(real_run):
    home = DeltaStore(real_run["buckets"]["us-east"])
    assert real_run["export"].startswith(PREFIX)
    view = inspect.open_view(home.url)
    assert inspect.column(view.versions, "version") == list(range(1, STEPS + 1))
    assert view.run_log == load_exported(home) and view.run_log_source.endswith(PREFIX)
    assert view.full_bytes == view.layout.numel * 2
    timeline = inspect.actor_timeline(view.run_log)
    assert set(timeline) == {"us-east-1", "eu-west-1"}
    assert all(points[-1][1] == STEPS for points in timeline.values())
    counts = inspect.settlements(view.run_log)
    assert sum(a for a, _ in counts.per_actor.values()) == STEPS * BATCH
    forwards = inspect.latencies(view.run_log, view.versions, "relay_forward")
    assert {p.who for p in forwards} == {"eu-west"} and {p.version for p in forwards} == set(range(1, STEPS + 1))
    assert all(0 <= p.seconds < 60 for p in forwards)
    matrix = inspect.change_matrix(view.versions, view.layout, by="layer")
    assert matrix.fractions.shape == (len(matrix.rows), STEPS) and (matrix.fractions <= 1).all()
    regional = inspect.version_table(DeltaStore(real_run["buckets"]["eu-west"]))  # no history: from manifests
    assert inspect.column(regional, "version") == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_verify_and_gc_on_the_real_run(real_run, tmp_path):
    for region in ("us-east", "eu-west"):
        report = verify_bucket(real_run["buckets"][region], deep=True)
        assert report.ok, report.problems
        assert report.checked["replayed_versions"] == STEPS and report.checked["snapshots_reproduced"] == 2
    copy = tmp_path / "home"
    shutil.copytree(real_run["buckets"]["us-east"], copy)
    report = collect_garbage(str(copy), 2, grace_s=0)
    assert report.plan.retained_snapshots == (2, 4) and report.plan.removed_deltas == (1, 2)
    after = verify_bucket(str(copy), deep=True)
    assert after.ok and after.checked["replayed_versions"] == 2
