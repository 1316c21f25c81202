"""Weight sync protocols behind one interface (workers.sync.base), chosen by name.

    protocol       moves                     path                                 module
    object_store   full state dict           Ray object store (zero-copy views)   object_store.py
    collective     full parameters           torch.distributed broadcast          collective.py
                                             (gloo on CPU, NCCL on GPU), per
                                             tensor or packed in buckets
    filesystem     full state dict           safetensors file per version         filesystem.py
                                             + notice
    lora           LoRA adapter only         object store; the worker merges or   lora.py
                                             registers a versioned adapter
    cuda_ipc       full state dict           a CUDA IPC handle to one flat GPU    cuda_ipc.py
                                             buffer (trainer and worker on the
                                             same GPU)

Usage (trainer and inference workers in different processes; see each class for the lifecycle):

    sender = make_sender(SyncConfig(protocol="collective", bucket_mb=32), num_receivers=2)
    sender.attach(trainer.model); endpoint = sender.endpoint()
    # concurrently: sender.connect() and receiver_i.connect(endpoint, rank=i + 1)
    report = sender.send(version, notify=lambda n: [w.update_weights.remote(n) for w in workers])
    # on an inference worker: staged = receiver.receive(notice); later receiver.apply(backend, staged)

May import the core, tasks, config and model tiers: the inference and train tiers above it
hold the two ends of each protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.sync.base import Notice, SyncReport, WeightReceiver, WeightSender, state_checksum
from workers.sync.collective import CollectiveReceiver, CollectiveSender
from workers.sync.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from workers.sync.filesystem import FilesystemReceiver, FilesystemSender
from workers.sync.lora import LoRAReceiver, LoRASender
from workers.sync.object_store import ObjectStoreReceiver, ObjectStoreSender

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

__all__ = [
    "Notice",
    "SyncReport",
    "WeightReceiver",
    "WeightSender",
    "make_receiver",
    "make_sender",
    "state_checksum",
    "vllm_transfer_engine",
]

# vLLM's own weight-transfer engines (vllm/distributed/weight_transfer/), CUDA only.
VLLM_NCCL, VLLM_IPC, VLLM_SPARSE_NCCL = "nccl", "ipc", "sparse_nccl"
# The project's, registered with vLLM's factory (workers/sync/vllm_engines.py).
ROLLWAY_MEMORY, ROLLWAY_FILES = "rollway_memory", "rollway_files"


def vllm_transfer_engine(
    device: str, placement: str, protocol: str, *, tensor_parallel_size: int = 1, changed_only: bool = False
) -> str:
    """The weight-transfer engine a vLLM inference worker is built with
    (`WeightTransferConfig.backend`), from where it runs (`placement.devices`,
    `placement.mode`) and the run's `sync.protocol`.

    GPU: vLLM's own. Colocated (or "cuda_ipc"), trainer and worker share the GPU: "ipc"
    (CUDA IPC handles). Disaggregated: a broadcast from the trainer's rank 0, bucketed,
    every rank of an fsdp2 pool joining the gathers: "nccl", or "sparse_nccl" for the
    changed weights only (`changed_only`). CPU: vLLM's engines need CUDA (NCCL
    communicators, CUDA IPC), so the project's: the weights handed over in memory to
    the worker in the inference worker's process, or as safetensors files each process
    of a tensor-parallel engine reads. "lora" moves adapters through vLLM's LoRA
    requests, not an engine: its merged fallback loads full weights like the others."""
    if device == "gpu":
        if placement == "colocated" or protocol == "cuda_ipc":
            return VLLM_IPC
        return VLLM_SPARSE_NCCL if changed_only else VLLM_NCCL
    if protocol == "cuda_ipc":
        raise ValueError("sync.protocol 'cuda_ipc' needs placement.devices 'gpu' (a CUDA IPC handle is GPU memory)")
    return ROLLWAY_MEMORY if tensor_parallel_size == 1 else ROLLWAY_FILES


def make_sender(
    sync: SyncConfig,
    *,
    num_receivers: int = 1,
    store: Any | None = None,
    scratch_dir: str | None = None,
    wire_dtype: str | None = None,
) -> WeightSender:
    """The trainer's half of `sync.protocol`, set up from the run's `sync` section.
    `store` replaces the Ray object store (tests); `scratch_dir` is the run's scratch
    directory, where a protocol keeps its files unless the config names a place;
    `wire_dtype` ("float32", "bfloat16"; None: the parameters' own) is the dtype
    "cuda_ipc" packs the weights in, the inference workers' dtype."""
    if sync.protocol == "cuda_ipc":
        import torch

        return CudaIpcSender(getattr(torch, wire_dtype) if wire_dtype else None)
    if sync.protocol == "object_store":
        return ObjectStoreSender(store, bucket_mb=sync.bucket_mb)
    if sync.protocol == "collective":
        return CollectiveSender(sync, num_receivers)
    if sync.protocol == "filesystem":
        return FilesystemSender(sync, scratch_dir)

    return LoRASender(store)


def make_receiver(
    sync: SyncConfig, *, model_dir: str | None = None, store: Any | None = None, scratch_dir: str | None = None
) -> WeightReceiver:
    """An inference worker's half of `sync.protocol`. `model_dir` (the directory its
    backend was built from) is needed by "lora", whose inference workers keep the base
    themselves; `scratch_dir` (the inference worker's own) is where "lora" writes adapter
    directories."""
    if sync.protocol == "object_store":
        return ObjectStoreReceiver(store)
    if sync.protocol == "collective":
        return CollectiveReceiver()
    if sync.protocol == "cuda_ipc":
        return CudaIpcReceiver()
    if sync.protocol == "filesystem":
        return FilesystemReceiver()
    if model_dir is None:
        raise ValueError("sync.protocol 'lora' needs the worker's model_dir (its base weights)")

    return LoRAReceiver(model_dir, store, adapter_root=scratch_dir)
