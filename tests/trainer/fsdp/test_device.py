"""``--device``: what auto/cpu/cuda resolve to here, and the process-group backend each one gets."""

import pytest
import torch

from aurora_store.errors import ConfigError
from workers.trainer.cli import parse_args
from workers.trainer.device import process_group_backend, resolve_device

BASE = ["--bucket", "b", "--redis", "redis://127.0.0.1:1/0", "--checkpoint-dir", "c"]


def test_device_flag_defaults_to_auto_and_rejects_unknown_devices():
    assert parse_args(BASE).device == "auto"
    assert parse_args([*BASE, "--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--device", "tpu"])
    with pytest.raises(ConfigError):
        resolve_device("tpu")


def test_cpu_is_gloo_and_cuda_is_nccl_for_device_tensors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")
def test_without_cuda_auto_is_the_cpu_and_cuda_is_a_clear_error():
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA"):
        resolve_device("cuda")

