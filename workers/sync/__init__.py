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

Into vLLM, "collective" is vLLM's own broadcast engine pair instead (`nccl` on GPUs, its
gloo twin on CPUs), which the trainer drives: engine_broadcast.py; and "cuda_ipc" into
vLLM is vLLM's own IPC engine pair, driven the same way: engine_ipc.py.

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

from workers.core.sync_messages import Notice, SyncReport
from workers.sync.base import WeightReceiver, WeightSender, state_checksum
from workers.sync.collective import CollectiveReceiver, CollectiveSender
from workers.sync.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from workers.sync.filesystem import FilesystemReceiver, FilesystemSender
from workers.sync.lora import LoRAReceiver, LoRASender
from workers.sync.object_store import ObjectStoreReceiver, ObjectStoreSender
from workers.sync.transfer_engines import (
    BROADCAST_ENGINES,
    DRIVEN_ENGINES,
    ROLLWAY_FILES,
    ROLLWAY_GLOO,
    ROLLWAY_MEMORY,
    VLLM_IPC,
    VLLM_NCCL,
    VLLM_SPARSE_NCCL,
    driven_engine,
    vllm_transfer_engine,
)

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

__all__ = [
    "BROADCAST_ENGINES",
    "DRIVEN_ENGINES",
    "ROLLWAY_FILES",
    "ROLLWAY_GLOO",
    "ROLLWAY_MEMORY",
    "VLLM_IPC",
    "VLLM_NCCL",
    "VLLM_SPARSE_NCCL",
    "Notice",
    "SyncReport",
    "WeightReceiver",
    "WeightSender",
    "driven_engine",
    "make_receiver",
    "make_sender",
    "state_checksum",
    "vllm_transfer_engine",
]


def make_sender(
    sync: SyncConfig,
    *,
    num_receivers: int = 1,
    store: Any | None = None,
    scratch_dir: str | None = None,
    wire_dtype: str | None = None,
    engine: str | None = None,
    ranks_per_receiver: int = 1,
    rank: int = 0,
) -> WeightSender:
    """The trainer's half of `sync.protocol`, set up from the run's `sync` section.
    `store` replaces the Ray object store (tests); `scratch_dir` is the run's scratch
    directory, where a protocol keeps its files unless the config names a place;
    `wire_dtype` ("float32", "bfloat16"; None: the parameters' own) is the dtype
    "cuda_ipc", a broadcast engine and `sync.delta` send the weights in, the inference
    workers' dtype.
    `engine` (`driven_engine`): the vLLM weight-transfer engine the trainer drives,
    each receiver a vLLM engine of `ranks_per_receiver` processes (its tensor-parallel size).
    `rank`: the trainer pool rank the sender runs on, for a sender that runs on every rank
    (`WeightSender.every_rank_sends`); rank 0 sends."""
    if engine == VLLM_IPC:
        # Here: these modules import vLLM, which only a run into vLLM needs (and has).
        from workers.sync.engine_ipc import EngineIpcSender

        return EngineIpcSender(sync, num_receivers, wire_dtype, rank)
    if engine is not None:
        # Here for the same reason: vLLM is imported only where a run goes into vLLM.
        from workers.sync.engine_broadcast import EngineBroadcastSender

        return EngineBroadcastSender(sync, num_receivers, engine, ranks_per_receiver, wire_dtype)
    if sync.protocol == "cuda_ipc":
        import torch

        return CudaIpcSender(getattr(torch, wire_dtype) if wire_dtype else None)
    if sync.protocol == "object_store":
        import torch

        if sync.delta and not wire_dtype:
            raise ValueError("sync.delta needs the inference workers' dtype (wire_dtype) to compare versions in")
        delta = getattr(torch, wire_dtype) if sync.delta and wire_dtype else None
        return ObjectStoreSender(store, bucket_mb=sync.bucket_mb, delta_dtype=delta)
    if sync.protocol == "collective":
        return CollectiveSender(sync, num_receivers)
    if sync.protocol == "filesystem":
        return FilesystemSender(sync, scratch_dir)

    return LoRASender(store)


def make_receiver(
    sync: SyncConfig,
    *,
    model_dir: str | None = None,
    store: Any | None = None,
    scratch_dir: str | None = None,
    engine: str | None = None,
    backend: Any | None = None,
) -> WeightReceiver:
    """An inference worker's half of `sync.protocol`. `model_dir` (the directory its
    backend was built from) is needed by "lora", whose inference workers keep the base
    themselves; `scratch_dir` (the inference worker's own) is where "lora" writes adapter
    directories; `engine`: as `make_sender`'s, received by `backend` (the worker's vLLM
    engine, built with it)."""
    if engine == VLLM_IPC:
        # Here: these modules import vLLM, which only a run into vLLM needs (and has).
        from workers.sync.engine_ipc import EngineIpcReceiver

        return EngineIpcReceiver(backend)
    if engine is not None:
        # Here for the same reason: vLLM is imported only where a run goes into vLLM.
        from workers.sync.engine_broadcast import EngineBroadcastReceiver

        return EngineBroadcastReceiver(engine, backend)
    if sync.protocol == "object_store":
        return ObjectStoreReceiver(store, delta=sync.delta)
    if sync.protocol == "collective":
        return CollectiveReceiver()
    if sync.protocol == "cuda_ipc":
        return CudaIpcReceiver()
    if sync.protocol == "filesystem":
        return FilesystemReceiver()
    if model_dir is None:
        raise ValueError("sync.protocol 'lora' needs the worker's model_dir (its base weights)")

    return LoRAReceiver(model_dir, store, adapter_root=scratch_dir)
