"""The trainer's side of the vLLM engines it drives: what it sends, and to whom.

Both engine pairs the trainer drives into vLLM (its broadcast pair, engine_broadcast.py;
its IPC pair, engine_ipc.py) take vLLM's trainer engine a `WeightSource` and a
`VLLMWeightSyncClient`:

- `PolicySource`, the policy the trainer computes (LoRA merged, a tied weight once)
  under the checkpoint's names and layout (what vLLM's loader takes), cut into buckets
  between modules; a sharded model's other ranks join the same gathers;
- `NoticeClient`, vLLM's four-call client protocol as a run's inference workers answer
  it: the update info goes out in the run's Notice, and each worker starts, updates and
  finishes its own engine at its apply point (`sync.update_mode`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from workers.core.sync_messages import Notice, Notify
from workers.model.loading import saved_form, tied_weight_names
from workers.model.lora import effective_live_state
from workers.sync.weights import gathered_parameters, module_buckets


class PolicySource(WeightSource):
    """vLLM's `WeightSource` over the trainer's model: `metadata()` names, dtypes and
    full shapes without gathering (the same pipeline on meta tensors); iteration
    gathers a bucket at a time (a sharded model's parameters are DTensors, gathered in
    `named_parameters` order as the pool's other ranks `follow`)."""

    def __init__(self, model: torch.nn.Module, bucket_mb: float, dtype: torch.dtype | None) -> None:
        extra = sorted(set(model.state_dict()) - {n for n, _ in model.named_parameters()} - tied_weight_names(model))
        if extra:
            raise NotImplementedError(
                f"collective sync moves parameters only; this model's state dict also has {extra[:5]} "
                "(buffers): use sync.protocol 'object_store' or 'filesystem'"
            )
        self.model, self.bucket_mb, self.dtype = model, bucket_mb, dtype
        self._metadata: list[ParamMeta] | None = None

    def _pairs(self, parameters: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in module_buckets(parameters, self.bucket_mb):
            state = saved_form(effective_live_state(bucket, self.model), self.model)
            bucket.clear()
            for name, tensor in state.items():
                yield name, tensor if self.dtype is None else tensor.to(self.dtype)

    def metadata(self) -> list[ParamMeta]:
        if self._metadata is None:
            shapes = (
                (name, torch.empty(p.shape, dtype=p.dtype, device="meta")) for name, p in self.model.named_parameters()
            )
            self._metadata = [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._pairs(shapes)]
        return self._metadata

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        with torch.no_grad():
            yield from self._pairs(gathered_parameters(self.model, "all"))


class NoticeClient:
    """vLLM's `VLLMWeightSyncClient` for a run: `update_weights` sends the update info to
    every inference worker in the run's Notice of `protocol` (one per send, or per chunk
    where vLLM's engine updates chunk by chunk), then `delivered`, which waits where the
    engine needs the workers done before it goes on (the IPC pair). The other three calls
    are the workers' own: each starts and finishes its engine at its apply point."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.pending: tuple[int, int, int, Notify] | None = None  # version, seq, bytes, notify

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: Any) -> None:
        if self.pending is None:
            raise RuntimeError(f"a weight update outside a {self.protocol} send")
        version, seq, nbytes, notify = self.pending
        notify(Notice(self.protocol, version, seq, nbytes, time.time(), {"update_info": update_info}))
        self.delivered(version, seq)

    def delivered(self, version: int, seq: int) -> None:
        """After each notice: nothing to wait for (a broadcast engine's own collective
        waits for the workers)."""

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass

    def send(self, engine: Any, source: PolicySource, version: int, seq: int, notify: Notify) -> list[ParamMeta]:
        """One round of vLLM's trainer `engine` over `source`, its notices through
        `notify`; returns what was sent (names, dtypes, shapes)."""
        meta = source.metadata()
        self.pending = (version, seq, sent_bytes(meta), notify)
        try:
            engine.send_weights()
        finally:
            self.pending = None
        return meta


def sent_bytes(meta: list[ParamMeta]) -> int:
    return sum(torch.Size(m.shape).numel() * m.dtype.itemsize for m in meta)
