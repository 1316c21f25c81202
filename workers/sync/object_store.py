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

With `sync.delta` each version is put in the inference workers' dtype, whole and as its
changes since the previous one (workers/sync/delta.py); a worker that loaded that
previous version fetches the changes only and rebuilds the version from its own copy.

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
from workers.core.sync_messages import Notice, Notify, SyncReport, end_to_end_ms
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.delta import Changes, DeltaEncoder, Shadow
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
            if w.data.size == 0:  # numpy's empty buffer has no stride torch can view
                out[name] = torch.empty(w.shape, dtype=getattr(torch, w.dtype))
                continue
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


def changes_to_wire(changes: dict[str, Changes]) -> tuple[dict[str, tuple[WireTensor | None, WireTensor]], int]:
    """A delta as the object store carries it (zero-copy views, as `to_wire`)."""
    wire, nbytes = {}, 0
    for name, c in changes.items():
        values, n = to_wire({"v": c.values})
        indices, m = to_wire({"i": c.indices}) if c.indices is not None else ({"i": None}, 0)
        wire[name] = (indices["i"], values["v"])
        nbytes += n + m
    return wire, nbytes


def changes_from_wire(wire: dict[str, tuple[WireTensor | None, WireTensor]]) -> dict[str, Changes]:
    out = {}
    for name, (indices, values) in wire.items():
        idx = from_wire({"i": indices})["i"] if indices is not None else None
        out[name] = Changes(idx, from_wire({"v": values})["v"])
    return out


class ObjectStoreSender(WeightSender):
    protocol = "object_store"

    def __init__(
        self, store: Any | None = None, bucket_mb: float = 32.0, delta_dtype: torch.dtype | None = None
    ) -> None:
        """`bucket_mb`: the size of each gathered bucket from a sharded trainer (a whole
        trainer puts its weights as one object). `delta_dtype` (`sync.delta`): also put
        each version's changes since the previous one, in this dtype (workers/sync/delta.py),
        and the whole version in it too."""
        super().__init__()
        self.store = store if store is not None else RayStore()
        self.bucket_mb = bucket_mb
        self.delta = DeltaEncoder(delta_dtype) if delta_dtype is not None else None
        self._base: int | None = None  # the version the next delta starts from
        # The last refs stay referenced until the next send, so the objects outlive
        # the workers' fetches even if a notice waits in an actor's queue.
        self._last_refs: list[Any] = []

    def send(self, version: int, notify: Notify) -> SyncReport:
        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        refs, delta_refs, nbytes, delta_bytes, tensors = [], [], 0, 0, 0
        for bucket in state_buckets(model, self.bucket_mb):
            if self.delta is not None:
                bucket, changes = self.delta.encode(bucket)
                dwire, d = changes_to_wire(changes)
                delta_refs.append(self.store.put(dwire))
                delta_bytes += d
            wire, n = to_wire(bucket)
            refs.append(self.store.put(wire))
            nbytes, tensors = nbytes + n, tensors + len(wire)
        self._last_refs = refs + delta_refs
        payload: dict[str, Any] = {"refs": refs}
        if self.delta is not None and self._base is not None:
            # A caught-up receiver pulls the delta: its bytes are the sync's.
            payload.update(delta=delta_refs, base=self._base, whole_bytes=nbytes)
            nbytes = delta_bytes
        if self.delta is not None:
            self._base = version
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, payload))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=tensors, messages=len(refs))

    def close(self) -> None:
        self._last_refs = []


@dataclass
class StagedDelta:
    """A delta fetched, not yet loaded (`sync.delta`): what `receive` hands to `apply`."""

    notice: Notice
    changes: dict[str, Changes]
    receive_ms: float
    messages: int


class ObjectStoreReceiver(WeightReceiver):
    protocol = "object_store"

    def __init__(self, store: Any | None = None, delta: bool = False) -> None:
        """`delta` (`sync.delta`): keep the last version loaded, and write each delta into it."""
        self.store = store if store is not None else RayStore()
        self.shadow = Shadow() if delta else None

    def receive(self, notice: Notice) -> StagedWeights | StagedDelta:
        clock = Stopwatch()
        if self.shadow is not None and "delta" in notice.payload:  # whether it applies is known at `apply`
            changes: dict[str, Changes] = {}
            for ref in notice.payload["delta"]:
                changes.update(changes_from_wire(self.store.get(ref)))
            return StagedDelta(notice, changes, clock.ms(), len(notice.payload["delta"]))
        return self._fetch_whole(notice, clock)

    def _fetch_whole(self, notice: Notice, clock: Stopwatch) -> StagedWeights:
        refs = notice.payload["refs"]
        weights: dict[str, torch.Tensor] = {}
        for ref in refs:
            weights.update(from_wire(self.store.get(ref)))
        return StagedWeights(notice, weights, clock.ms(), len(weights), len(refs))

    def apply(self, backend: Any, staged: StagedWeights | StagedDelta) -> SyncReport:
        if isinstance(staged, StagedWeights):
            if self.shadow is not None:
                self.shadow.take_whole(staged.notice.version, staged.weights)
            return apply_full(self.protocol, backend, staged)
        assert self.shadow is not None  # a delta is staged only then
        notice = staged.notice
        if self.shadow.version == notice.payload["base"]:
            clock = Stopwatch()
            self.shadow.take_changes(notice.version, staged.changes)
            rebuilt = StagedWeights(
                notice, self.shadow.state, staged.receive_ms + clock.ms(), len(staged.changes), staged.messages
            )
            return apply_full(self.protocol, backend, rebuilt)
        # New, or it did not load the version the delta starts from: the whole version.
        whole = self._fetch_whole(notice, Stopwatch())
        self.shadow.take_whole(notice.version, whole.weights)
        report = apply_full(self.protocol, backend, whole)
        report.bytes = notice.payload["whole_bytes"]
        return report
