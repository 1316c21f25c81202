"""Which device an engine process computes on, and in which dtype.

Inside a Ray actor the answer is what Ray gave it: an actor that asked for GPUs sees
exactly those (Ray narrows CUDA_VISIBLE_DEVICES to them, so the first is `cuda:0`); an
actor that asked for none computes on the CPU even on a GPU node — Ray 2.60 leaves
CUDA_VISIBLE_DEVICES as the node has it for such an actor, and `torch.cuda.is_available()`
would put every such process on the node's GPU 0. Outside Ray (benchmarks, tests) a
process uses a GPU when torch sees one.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _ray_gpu_ids() -> list | None:
    """The GPU ids Ray assigned this actor ([] for none), or None outside a Ray actor."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    return list(ray.get_gpu_ids())


def assigned_device() -> torch.device:
    """`cuda:0` when this process holds a GPU (see the module docstring), else the CPU."""
    gpus = _ray_gpu_ids()
    if gpus is not None and not gpus:
        return torch.device("cpu")
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def autocast(device: torch.device, dtype: str):
    """The trainer's compute context: bf16 autocast on `device` for "bfloat16" (master
    weights stay float32), nothing for "float32"."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a wall-clock timing covers the work it names."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
