"""Protocol "cuda_ipc": the weights handed over in GPU memory, between processes on one GPU.

The trainer packs its weights (under checkpoint names, LoRA merged) into one flat buffer
on its GPU and notifies the workers with a CUDA IPC handle to it; each worker maps that
memory into its own process and copies straight from it into its backend's weights. No
byte crosses PCIe or a network: one device-to-device copy on each side. This is the
same-node path of NeMo-RL and MILES, for colocated pools (trainer and inference on the
same GPU, time-sharing it); across GPUs or nodes use "collective" or "filesystem".

The handle is torch's own (`torch.multiprocessing.reductions.reduce_tensor`, what a
`torch.multiprocessing` queue sends for a CUDA tensor): it carries the allocation, an
event the receiver waits on before reading, and a reference count that keeps the buffer
alive in the trainer's allocator until every receiver has dropped its mapping — so the
trainer may pack the next version while a slow worker still loads the previous one.

A buffer per version costs one copy of the weights in the wire dtype on the trainer's
GPU while receivers hold it; `wire_dtype` (e.g. bfloat16 from float32 masters) halves it
and the receiver's load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from workers.core.sync_messages import Notice, Notify, SyncReport
from workers.model.lora import effective_state_dict
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.object_store import StagedWeights, apply_full


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int  # elements into the flat buffer
    numel: int


def device_uuid(device: torch.device) -> str:
    """The GPU's UUID: the same physical device whatever index a process sees it at."""
    return str(torch.cuda.get_device_properties(device).uuid)


def pack(state: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, tuple[Slot, ...]]:
    """One flat `dtype` buffer on the state's device holding every tensor once (a name
    that shares storage with an earlier one, as tied embeddings do, is left out: the
    receivers' loaders accept that, as they do from save_pretrained)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    slots, offset = [], 0
    for name, t in state.items():
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        slots.append(Slot(name, tuple(t.shape), offset, t.numel()))
        offset += t.numel()
    device = next(iter(state.values())).device
    flat = torch.empty(offset, dtype=dtype, device=device)
    for slot in slots:
        flat[slot.offset : slot.offset + slot.numel].copy_(state[slot.name].reshape(-1))
    return flat, tuple(slots)


def views(flat: torch.Tensor, slots: tuple[Slot, ...]) -> dict[str, torch.Tensor]:
    return {s.name: flat[s.offset : s.offset + s.numel].view(s.shape) for s in slots}


class CudaIpcSender(WeightSender):
    protocol = "cuda_ipc"

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        """`wire_dtype`: the dtype the weights travel in (None: the parameters' own)."""
        super().__init__()
        self.wire_dtype = wire_dtype
        self._last: torch.Tensor | None = None  # the newest version's buffer

    def attach(self, model: torch.nn.Module) -> None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(
                f"sync.protocol 'cuda_ipc' hands weights over in GPU memory, but the trainer's model is on "
                f"{device}: give the trainer a GPU (placement.devices 'gpu'), or choose 'object_store', "
                "'collective' or 'filesystem'"
            )
        super().attach(model)

    def endpoint(self) -> dict[str, Any]:
        device = next(self._require_model().parameters()).device
        return {"protocol": self.protocol, "device_uuid": device_uuid(device)}

    def send(self, version: int, notify: Notify) -> SyncReport:
        from torch.multiprocessing.reductions import reduce_tensor

        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        state = effective_state_dict(model)
        flat, slots = pack(state, self.wire_dtype or next(iter(state.values())).dtype)
        torch.cuda.current_stream(flat.device).synchronize()
        self._last = flat
        nbytes = flat.numel() * flat.element_size()
        payload = {"handle": reduce_tensor(flat), "slots": slots, "device_uuid": device_uuid(flat.device)}
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, payload))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=len(slots), messages=1)

    def close(self) -> None:
        self._last = None


class CudaIpcReceiver(WeightReceiver):
    protocol = "cuda_ipc"

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        super().connect(endpoint, rank)
        self._check_same_gpu(endpoint["device_uuid"])

    @staticmethod
    def _check_same_gpu(uuid: str) -> None:
        if not torch.cuda.is_available():
            raise ValueError(
                "sync.protocol 'cuda_ipc': this inference worker has no GPU, so it cannot map the trainer's "
                "GPU memory; colocate the pools on GPUs (placement.mode 'colocated') or choose another protocol"
            )
        if device_uuid(torch.device("cuda", torch.cuda.current_device())) != uuid:
            raise ValueError(
                "sync.protocol 'cuda_ipc' needs the trainer and this inference worker on the same GPU "
                "(placement.mode 'colocated'); across GPUs choose 'collective' (NCCL) or 'filesystem'"
            )

    def receive(self, notice: Notice) -> StagedWeights:
        """Map the version's buffer (cheap: no copy) as views under checkpoint names."""
        clock = Stopwatch()
        rebuild, args = notice.payload["handle"]
        flat = rebuild(*args)  # maps the trainer's allocation; waits on its event
        weights = views(flat, notice.payload["slots"])
        return StagedWeights(notice, weights, clock.ms(), len(weights), 1)

    def apply(self, backend: Any, staged: StagedWeights) -> SyncReport:
        # The device-to-device copy into the backend, timed to its end; then the views
        # go, so the trainer's allocator may free that version.
        report = apply_full(self.protocol, backend, staged)
        staged.weights = {}
        return report
