"""The trainer's weights as a weight sender reads them: whole, or one gathered bucket at a time.

A single trainer and a ddp rank hold the whole policy, so a sender reads views of its
parameters (no copy; a LoRA model's merge is a copy). An fsdp2 rank holds a shard of
each parameter (a DTensor): the policy exists whole in no process. Rank 0's sender then
gathers it parameter by parameter (`DTensor.full_tensor`, an all-gather every rank
joins) and hands its protocol one bucket of about `sync.bucket_mb` at a time, cut only
between modules, so a LoRA module's base and adapter land in one bucket and merge
there. Meanwhile every other rank runs `follow`: the same gathers in the same order,
their results dropped. No rank ever holds more than one bucket of gathered weights; the
inference workers, which hold the whole model anyway, receive it bucket by bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from workers.model.lora import effective_live_state, effective_state_dict, split_live_state
from workers.sync.base import Gathers


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def gathered_parameters(model: torch.nn.Module, which: Gathers = "all") -> Iterator[tuple[str, torch.Tensor]]:
    """(live name, whole tensor) for each parameter (or each adapter parameter), in the
    model's order. A sharded parameter is all-gathered: a collective, so every rank of
    the pool must iterate this in step (`follow`)."""
    from torch.distributed.tensor import DTensor

    for name, p in model.named_parameters():
        if which == "adapter" and ".lora_" not in name:
            continue
        if isinstance(p, DTensor):
            full = p.full_tensor()
            yield name, (full.wait() if hasattr(full, "wait") else full).detach()
        else:
            yield name, p.detach()


def follow(model: torch.nn.Module, which: Gathers) -> None:
    """What ranks 1.. of a sharded pool run while rank 0 sends: join every gather."""
    for _ in gathered_parameters(model, which):
        pass


def _module_of(name: str) -> str:
    """The module a live parameter name belongs to (a LoRA layer's base and adapter
    parameters share it)."""
    for marker in (".base_layer.", ".lora_A.", ".lora_B."):
        if marker in name:
            return name.split(marker)[0]
    return name.rsplit(".", 1)[0]


def state_buckets(model: torch.nn.Module, bucket_mb: float) -> Iterator[dict[str, torch.Tensor]]:
    """The policy the model computes under checkpoint names (LoRA merged), in buckets:
    one bucket of views for a model held whole; gathered buckets of about `bucket_mb`,
    cut between modules, for a sharded one."""
    if not is_sharded(model):
        yield effective_state_dict(model)
        return
    limit = bucket_mb * 2**20
    bucket: dict[str, torch.Tensor] = {}
    size, module = 0, ""
    for name, full in gathered_parameters(model, "all"):
        here = _module_of(name)
        if bucket and size >= limit and here != module:
            yield effective_live_state(bucket, model)
            bucket, size = {}, 0
        bucket[name] = full
        size += full.numel() * full.element_size()
        module = here
    if bucket:
        yield effective_live_state(bucket, model)


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A sharded LoRA model's adapter, gathered, under peft's saved names (small: a
    rank-8 adapter of a 7B model is tens of MB)."""
    return split_live_state(dict(gathered_parameters(model, "adapter")))[1]
