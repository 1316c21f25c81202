"""The weight-sync interface every protocol implements (the message between its halves and
what a sync reports are records of workers/core/sync_messages.py).

A sync has two halves that live in different processes (the trainer and each inference
worker) and one small message between them, the `Notice`:

    trainer:    sender.send(version, notify) ──notify(Notice)──▶ receiver.receive(notice)
                                                                  receiver.apply(backend, staged)

- `WeightSender.send` moves the trainer's weights (or adapter) out and calls `notify`
  exactly once with a Notice for the receivers. *When* it notifies is the protocol's
  business: after the payload is in place for the object store and the filesystem,
  before the broadcast for a collective (a broadcast only completes once the receivers
  join it). The orchestrator's `notify` delivers the Notice to every inference worker (a
  Ray actor call; a queue in tests) and must not wait for them.
- `WeightReceiver.receive` fetches the payload into staging memory. It may run while the
  backend generates (an inference worker's control thread), so the transfer overlaps
  generation.
- `WeightReceiver.apply` puts staged weights into the backend; the inference worker
  calls it between two generate calls (drain semantics: a call in flight finishes on old
  weights; workers/rollout/partial_rollouts.py for the other modes).

Latencies (ms): trainer side = how long `send` blocked the trainer; inference side =
receive + apply on one inference worker; end to end = wall clock from the start of
`send` to the weights being live in that inference worker (so it includes the drain
wait in a running pipeline).
`bytes` is the payload one receiver gets.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from workers.core.sync_messages import Gathers, Notice, Notify, SyncReport


class WeightSender(ABC):
    """Trainer side of a protocol. Lifecycle: attach(model) → endpoint() → connect()
    (all ranks at once for a collective) → send(version, notify) per step → close()."""

    protocol: ClassVar[str]
    # What `send` gathers from a sharded trainer, so that the pool's other ranks join the
    # same gathers (workers/sync/weights.py): every parameter, or the LoRA adapter's.
    gathers: ClassVar[Gathers] = "all"
    # True where every rank of a trainer pool runs a sender of its own beside rank 0's
    # (`make_sender(rank=r)`), sending the same versions in step: vLLM's IPC engine
    # all-gathers each rank's handles over the pool's group.
    every_rank_sends: ClassVar[bool] = False

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self._seq = 0

    def attach(self, model: torch.nn.Module) -> None:
        """Hold the trainer's model. Call before the first send; a protocol may re-lay
        the parameters out in memory (same values, same Parameter objects)."""
        self.model = model

    def endpoint(self) -> dict[str, Any]:
        """What receivers need to `connect` (picklable). Default: nothing."""
        return {"protocol": self.protocol}

    def connect(self) -> None:
        """Join the receivers (a collective's rendezvous); no-op for most protocols."""

    @abstractmethod
    def send(self, version: int, notify: Notify) -> SyncReport:
        """Move the weights of `version` out; call `notify` once; return the trainer's view."""

    def close(self) -> None:
        """Release what the sender holds (process groups, files, object refs)."""

    # helpers for subclasses ------------------------------------------------------

    def _require_model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.send before attach(model): attach the trainer's model first")
        return self.model

    def _next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq


class WeightReceiver(ABC):
    """Inference side of a protocol. Lifecycle: connect(endpoint, rank) → receive(notice)
    → apply(backend, staged) per version → close()."""

    protocol: ClassVar[str]
    # True where the sender's `send` waits until this receiver applies (its payload moves
    # inside `apply`): the inference worker must then apply wherever it waits on the trainer.
    blocks_sender: ClassVar[bool] = False

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        """Join the sender (rank ≥ 1 among the receivers); no-op for most protocols."""
        if endpoint.get("protocol") != self.protocol:
            raise ValueError(
                f"{type(self).__name__} cannot connect to a {endpoint.get('protocol')!r} sender; "
                f"trainer and workers must use the same sync.protocol"
            )

    @abstractmethod
    def receive(self, notice: Notice) -> Any:
        """Fetch the payload of `notice` into staging memory; returns what `apply` takes.
        Safe to call while the backend generates."""

    @abstractmethod
    def apply(self, backend: Any, staged: Any) -> SyncReport | None:
        """Load staged weights into `backend`; returns this inference worker's report,
        or None if there was nothing new to load (a collective receiver loads the newest
        version staged, which an earlier call may have loaded already)."""

    def close(self) -> None:
        """Release what the receiver holds."""


class Stopwatch:
    """perf_counter milliseconds since construction."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3


def tensor_nbytes(state_dict: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state_dict.values())


def state_checksum(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over name-sorted tensors (name, dtype, shape and raw bytes): equal
    checksums mean bit-identical weights under the same names."""
    hasher = StateHasher()
    for name in sorted(state_dict):
        hasher.add(name, state_dict[name])
    return hasher.hexdigest()


class StateHasher:
    """`state_checksum` taken a tensor at a time, names in sorted order (a sharded
    trainer's weights streamed as they are gathered: workers/sync/weights.py)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._last: str | None = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self._last is not None and name <= self._last:
            raise ValueError(f"state_checksum takes names in sorted order: {name!r} after {self._last!r}")
        self._last = name
        t = tensor.detach().to("cpu").contiguous()
        self._sha.update(name.encode())
        self._sha.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            self._sha.update(t.reshape(-1).view(torch.uint8).numpy().data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()
