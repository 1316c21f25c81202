"""Protocol "object_store": the full state dict through the Ray object store.

The trainer puts its weights into the object store once per version and notifies the
workers with the object refs (one; or one per gathered bucket from a sharded trainer,
workers/sync/weights.py); each worker fetches them (zero-copy on the same node) and
loads them into its backend. Works across Ray nodes with no extra set-up; every sync moves
the whole model and pays one copy into shared memory on the trainer.

Tensors travel as uint8 numpy views, which Ray moves out-of-band and maps zero-copy on
the receiving side (the trick behind RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1, without a
process-wide switch that would change how every tensor in the cluster is serialised).
The received tensors are read-only views of object-store memory; `load_weights` copies.

The store is injectable: `RayStore` in a run, `InProcessStore` for tests and threads.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workers.core.devices import synchronize
from workers.sync.base import (
    Notice,
    Notify,
    Stopwatch,
    SyncReport,
    WeightReceiver,
    WeightSender,
    end_to_end_ms,
)
from workers.sync.weights import state_buckets


@dataclass
class WireTensor:
    data: np.ndarray  # uint8 view of the tensor's bytes
    dtype: str  # e.g. "float32"
    shape: tuple[int, ...]


def to_wire(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, WireTensor], int]:
    """State dict → {name: WireTensor}, without copying contiguous CPU tensors."""
    wire, nbytes = {}, 0
    for name, t in state_dict.items():
        t = t.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy()
        wire[name] = WireTensor(data, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        nbytes += data.nbytes
    return wire, nbytes


def from_wire(wire: dict[str, WireTensor]) -> dict[str, torch.Tensor]:
    """{name: WireTensor} → tensors viewing the received buffers (no copy)."""
    out = {}
    with warnings.catch_warnings():
        # Object-store buffers are read-only; every consumer here only reads them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, w in wire.items():
            out[name] = torch.from_numpy(w.data).view(getattr(torch, w.dtype)).reshape(w.shape)
    return out


class RayStore:
    """Ray's object store. Refs are owned by the putting process (the trainer)."""

    def put(self, obj: Any) -> Any:
        import ray

        return ray.put(obj)

    def get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)


class InProcessStore:
    """A dict standing in for the object store between threads of one process. `put`
    deep-copies, as serialisation would: the trainer's tensors keep changing after it."""

    def __init__(self) -> None:
        self._objects: dict[int, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def put(self, obj: Any) -> int:
        ref = next(self._ids)
        with self._lock:
            self._objects[ref] = copy.deepcopy(obj)
        return ref

    def get(self, ref: int) -> Any:
        with self._lock:
            return self._objects[ref]


@dataclass
class StagedWeights:
    """Fetched, not yet loaded: what `receive` hands to `apply`."""

    notice: Notice
    weights: dict[str, torch.Tensor]
    receive_ms: float
    tensors: int
    messages: int


def apply_full(protocol: str, backend: Any, staged: StagedWeights) -> SyncReport:
    """Full reload of staged weights into `backend`; the report of one worker."""
    clock = Stopwatch()
    backend.load_weights(staged.weights)
    # A GPU backend's copies are queued, not done: time the load to its end.
    synchronize(getattr(backend, "device", torch.device("cpu")))
    load_ms = clock.ms()
    return SyncReport(
        protocol=protocol,
        version=staged.notice.version,
        bytes=staged.notice.nbytes,
        inference_ms=staged.receive_ms + load_ms,
        end_to_end_ms=end_to_end_ms(staged.notice),
        receive_ms=staged.receive_ms,
        tensors=staged.tensors,
        messages=staged.messages,
    )


class ObjectStoreSender(WeightSender):
    protocol = "object_store"

    def __init__(self, store: Any | None = None, bucket_mb: float = 32.0) -> None:
        """`bucket_mb`: the size of each gathered bucket from a sharded trainer (a whole
        trainer puts its weights as one object)."""
        super().__init__()
        self.store = store if store is not None else RayStore()
        self.bucket_mb = bucket_mb
        # The last refs stay referenced until the next send, so the objects outlive
        # the workers' fetches even if a notice waits in an actor's queue.
        self._last_refs: list[Any] = []

    def send(self, version: int, notify: Notify) -> SyncReport:
        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        refs, nbytes, tensors = [], 0, 0
        for bucket in state_buckets(model, self.bucket_mb):
            wire, n = to_wire(bucket)
            refs.append(self.store.put(wire))
            nbytes, tensors = nbytes + n, tensors + len(wire)
        self._last_refs = refs
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, {"refs": refs}))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=tensors, messages=len(refs))

    def close(self) -> None:
        self._last_refs = []


class ObjectStoreReceiver(WeightReceiver):
    protocol = "object_store"

    def __init__(self, store: Any | None = None) -> None:
        self.store = store if store is not None else RayStore()

    def receive(self, notice: Notice) -> StagedWeights:
        clock = Stopwatch()
        refs = notice.payload["refs"]
        weights: dict[str, torch.Tensor] = {}
        for ref in refs:
            weights.update(from_wire(self.store.get(ref)))
        return StagedWeights(notice, weights, clock.ms(), len(weights), len(refs))

    def apply(self, backend: Any, staged: StagedWeights) -> SyncReport:
        return apply_full(self.protocol, backend, staged)
