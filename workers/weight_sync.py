"""Weight sync, protocol "full_reload": the whole state dict through the Ray object store.

The trainer puts its state dict into the object store once (`publish`) and hands the
reference to every inference worker; each worker fetches it (`fetch`) as soon as it
arrives, overlapping the transfer with generation, and loads it into its backend
between two generate calls (drain semantics: in-flight requests finish on the old
weights). Three latencies are measured:

- trainer side: the trainer's `ray.put` (serialise into shared memory);
- inference side: fetch + `backend.load_weights` on the worker;
- end to end: trainer publish → weights live in the worker (includes the drain wait).

Tensors travel as uint8 numpy views, which Ray moves out-of-band and maps zero-copy on
the receiving side: the same trick as RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1, without a
process-wide switch that would also change how every other tensor in the cluster is
serialised. Measured here (2 busy cores), a 40 MiB state dict: put 234 ms + fetch in
another actor 229 ms as plain tensors, 75 ms + 0.6 ms as wire tensors. The received
tensors are read-only views of object-store memory; `load_weights` copies them.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import ray
import torch

PROTOCOL = "full_reload"


@dataclass
class WireTensor:
    data: np.ndarray  # uint8 view of the tensor's bytes
    dtype: str  # e.g. "float32"
    shape: tuple[int, ...]


@dataclass
class WeightUpdate:
    """What an inference worker receives: the weights' object ref (wrapped in a list so
    Ray does not fetch it before the call; the worker fetches it itself and times it)."""

    version: int
    refs: list  # [ObjectRef of dict[str, WireTensor]]
    nbytes: int
    published_at: float  # time.time() at publish, for end-to-end latency


@dataclass
class SyncStats:
    """One sync as seen by one inference worker."""

    version: int
    nbytes: int
    fetch_ms: float
    load_ms: float
    end_to_end_ms: float

    @property
    def inference_ms(self) -> float:
        return self.fetch_ms + self.load_ms


def to_wire(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, WireTensor], int]:
    """State dict → {name: WireTensor} without copying contiguous CPU tensors."""
    wire, nbytes = {}, 0
    for name, t in state_dict.items():
        t = t.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy()
        wire[name] = WireTensor(data, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        nbytes += data.nbytes
    return wire, nbytes


def from_wire(wire: dict[str, WireTensor]) -> dict[str, torch.Tensor]:
    """{name: WireTensor} → state dict of tensors viewing the received buffers."""
    out = {}
    with warnings.catch_warnings():
        # The buffers are read-only object-store memory; load_weights only reads them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, w in wire.items():
            flat = torch.from_numpy(w.data)
            out[name] = flat.view(getattr(torch, w.dtype)).reshape(w.shape)
    return out


def publish(state_dict: dict[str, torch.Tensor], version: int, workers: list) -> tuple[WeightUpdate, float]:
    """Trainer side: put the weights in the object store and notify every worker.

    Does not wait for the workers (the trainer goes on training); returns the update and
    the trainer-side latency in ms. The caller must keep `update` referenced until the
    next publish, so the object outlives the workers' fetches."""
    t0 = time.perf_counter()
    wire, nbytes = to_wire(state_dict)
    update = WeightUpdate(version, [ray.put(wire)], nbytes, time.time())
    trainer_ms = (time.perf_counter() - t0) * 1e3
    for w in workers:
        w.update_weights.remote(update)
    return update, trainer_ms


def fetch(update: WeightUpdate) -> tuple[dict[str, torch.Tensor], float]:
    """Inference side, part 1: fetch the weights; returns (state dict, ms)."""
    t0 = time.perf_counter()
    state_dict = from_wire(ray.get(update.refs[0]))
    return state_dict, (time.perf_counter() - t0) * 1e3


def load(backend, update: WeightUpdate, state_dict: dict[str, torch.Tensor], fetch_ms: float) -> SyncStats:
    """Inference side, part 2: load fetched weights into `backend` (between generate calls)."""
    t0 = time.perf_counter()
    backend.load_weights(state_dict)
    load_ms = (time.perf_counter() - t0) * 1e3
    return SyncStats(
        version=update.version,
        nbytes=update.nbytes,
        fetch_ms=fetch_ms,
        load_ms=load_ms,
        end_to_end_ms=(time.time() - update.published_at) * 1e3,
    )
