"""``--metrics-port 0``: a process binds whatever port is free when it starts serving and logs it, and a local
cluster finds each process's port in that process's own log. A port picked by the launcher and bound by the
process seconds later can be taken in between by another server (a parallel test's SeaweedFS gRPC port did
so on CI: the actor died at start and the scrape read SeaweedFS)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from aurora_store.errors import MetricsPortError
from aurora_store.metrics import Metrics, port_number
from workers.cluster import ClusterSpec, LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_port_zero_binds_a_free_port_returns_it_and_logs_it(caplog):
    first, second = Metrics("actor", "run-a", "us-east"), Metrics("relay", "run-b", "eu-west")
    with caplog.at_level(logging.INFO, logger="aurora.metrics"):
        a, b = first.serve(0, addr="127.0.0.1"), second.serve(0, addr="127.0.0.1")
    assert 0 not in (a, b) and a != b
    assert 'run="run-a"' in scrape(a) and 'run="run-b"' in scrape(b)  # each port serves its own registry
    assert [r.metrics_port for r in caplog.records if r.getMessage() == "serving metrics"] == [a, b]


def test_a_port_someone_else_listens_on_is_a_typed_error_at_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError, match=f"cannot serve metrics on 127.0.0.1:{port}: .*in use") as err:
            Metrics("actor", "run").serve(port, addr="127.0.0.1")
    assert isinstance(err.value, OSError)


@pytest.mark.parametrize("text", ["-1", "65536", "nine", ""])
def test_a_port_out_of_range_is_refused_by_name(text):
    with pytest.raises(argparse.ArgumentTypeError, match="TCP port from 0 to 65535"):
        port_number(text)
    assert (port_number("0"), port_number("65535")) == (0, 65535)


@pytest.mark.parametrize("module", ["workers.actor", "workers.relay", "workers.trainer"])
def test_each_process_refuses_a_bad_metrics_port_before_starting(module):
    done = subprocess.run([sys.executable, "-m", module, "--metrics-port", "70000"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--metrics-port: needs a TCP port from 0 to 65535" in done.stderr


# A real process that serves a real registry on port 0 and logs as the cluster's processes do; with
# HOLD_FILE set it waits for that file before serving, with FAIL set it exits first.
SERVER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from aurora_store import logs
    from aurora_store.metrics import Metrics
    logs.configure("probe", os.environ["RUN"], json_lines=True)
    if os.environ.get("FAIL"):
        sys.exit(3)
    hold = os.environ.get("HOLD_FILE")
    while hold and not Path(hold).exists():
        time.sleep(0.05)
    Metrics("actor", os.environ["RUN"]).serve(0)
    time.sleep(600)
""")


@pytest.fixture()
def cluster(tmp_path):
    (tmp_path / "probe_server.py").write_text(SERVER)
    cluster = LocalCluster(ClusterSpec(tmp_path / "run", metrics=True))
    cluster.group.env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    yield cluster
    cluster.group.stop_all(timeout=5)


def test_the_cluster_reads_the_current_process_port_not_an_earlier_runs(cluster, tmp_path):
    cluster.group.start("probe", "probe_server", [], env={"RUN": "first"})
    first = cluster.metrics_port("probe", timeout=60)
    assert 'run="first"' in scrape(first)
    cluster.group["probe"].terminate(timeout=5)
    hold = tmp_path / "serve-now"
    cluster.group.start("probe", "probe_server", [], env={"RUN": "second", "HOLD_FILE": str(hold)})
    # The first run's line is still in the log the restart appends to: it must not be taken for this run's.
    with pytest.raises(TimeoutError, match="probe did not serve metrics"):
        cluster.metrics_port("probe", timeout=1.0)
    hold.touch()
    second = cluster.metrics_port("probe", timeout=60)
    assert 'run="second"' in scrape(second)


def test_a_process_that_exits_before_serving_is_reported_with_its_exit_code(cluster):
    cluster.group.start("probe", "probe_server", [], env={"RUN": "r", "FAIL": "1"})
    with pytest.raises(RuntimeError, match=r"probe exited \(3\) before serving metrics"):
        cluster.metrics_port("probe", timeout=60)
