"""The trainer's policy as vLLM's `WeightSource`: what vLLM's trainer-side engines send.

Both engine pairs the trainer drives into vLLM (its broadcast pair, engine_broadcast.py;
its IPC pair, engine_ipc.py) iterate a source for the tensors of each update. This one
is the policy the trainer computes (LoRA merged, a tied weight once) under the
checkpoint's names and layout (what vLLM's loader takes), cut into buckets between
modules; a sharded model's other ranks join the same gathers.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

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
