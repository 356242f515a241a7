"""A local cluster shares the host's cores out among its processes (ClusterSpec.thread_env)."""

from __future__ import annotations

import os

from workers.cluster_spec import ClusterSpec


def test_processes_count_trainer_ranks_relays_and_actors(tmp_path):
    spec = ClusterSpec(tmp_path, actors={"us-east": 2, "eu-west": 3, "ap-south": 0}, trainer_ranks=2)
    assert spec.processes == 2 + 1 + 5  # no relay for the home region, none for a region without actors


def test_each_process_gets_its_share_of_the_cores(tmp_path):
    spec = ClusterSpec(tmp_path, actors={"us-east": 1})
    env = spec.thread_env({})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    crowded = ClusterSpec(tmp_path, actors={"us-east": 4 * (os.cpu_count() or 1)})
    assert crowded.thread_env({})["OMP_NUM_THREADS"] == "1"
    assert ClusterSpec(tmp_path, threads_per_process=3).thread_env({})["OMP_NUM_THREADS"] == "3"


def test_an_explicit_setting_wins(tmp_path):
    spec = ClusterSpec(tmp_path)
    assert spec.thread_env({"OMP_NUM_THREADS": "7"}) == {}
    assert ClusterSpec(tmp_path, env={"MKL_NUM_THREADS": "2"}).thread_env({}) == {}
