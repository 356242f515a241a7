"""Where the trainer's model, optimizer state and GRPO step live: ``--device {auto,cuda,cpu}``.

``auto`` is CUDA when ``torch.cuda.is_available()``, else the CPU. Under ``torchrun`` every process takes
the GPU its ``LOCAL_RANK`` names (one process per GPU). The process group then runs NCCL for CUDA tensors
(FSDP2's all-gathers and reduce-scatters) and gloo for CPU tensors (the small JSON collectives and the
snapshot's row gathers, which stay on the host); on the CPU it is gloo alone, as before.
"""

from __future__ import annotations

import torch

from aurora_store.config import LaunchEnv
from aurora_store.errors import ConfigError

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(choice: str, local_rank: int | None = None) -> torch.device:
    """The device ``choice`` means on this machine for this process (``LOCAL_RANK`` from the environment)."""
    if choice not in DEVICES:
        raise ConfigError(f"unknown device {choice!r}; choose from {list(DEVICES)}")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device (CPU-only build or no driver)")
    index = (LaunchEnv.from_env().local_rank or 0) if local_rank is None else local_rank
    if index >= torch.cuda.device_count():
        raise ConfigError(f"LOCAL_RANK {index} but only {torch.cuda.device_count()} CUDA device(s): run one "
                          f"process per GPU (torchrun --nproc-per-node ≤ {torch.cuda.device_count()})")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def process_group_backend(device: torch.device) -> str:
    """NCCL for the device's tensors, gloo for host tensors; gloo alone on the CPU."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def configure_compute(device: torch.device) -> None:
    """On CUDA, let fp32 matmuls and convolutions use TF32 (what stays fp32 outside bf16 autocast: the optimizer's
    arithmetic is elementwise and unaffected)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast_dtype(device: torch.device, compute_dtype: str, world_size: int) -> torch.dtype | None:
    """One CUDA rank runs forward under autocast in ``compute_dtype`` (under FSDP2 the gathered parameters are
    already in it); a CPU rank computes in fp32, as the tests that compare against single-process AdamW expect."""
    if device.type != "cuda" or world_size > 1 or compute_dtype == "float32":
        return None
    return torch.bfloat16
