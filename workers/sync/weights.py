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

The policy's checksum, its export and a checkpoint's model files read it the same way,
in checkpoint-name order (`effective_stream`, `base_stream`): a module gathered at a
time, each tensor dropped once its reader has hashed or written it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from workers.core.sync_messages import Gathers
from workers.model.loading import tied_weight_names, untied
from workers.model.lora import effective_live_state, effective_state_dict, split_live_state
from workers.sync.base import StateHasher


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
    for bucket in module_buckets(gathered_parameters(model, "all"), bucket_mb):
        yield effective_live_state(bucket, model)


def module_buckets(
    parameters: Iterator[tuple[str, torch.Tensor]], bucket_mb: float
) -> Iterator[dict[str, torch.Tensor]]:
    """(live name, tensor) pairs in buckets of about `bucket_mb`, cut only between
    modules (a LoRA module's base and adapter in one bucket). The cut reads names and
    sizes alone: the same pairs on the meta device cut the same way."""
    limit = bucket_mb * 2**20
    bucket: dict[str, torch.Tensor] = {}
    size, module = 0, ""
    for name, full in parameters:
        here = _module_of(name)
        if bucket and size >= limit and here != module:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = full
        size += full.numel() * full.element_size()
        module = here
    if bucket:
        yield bucket


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A sharded LoRA model's adapter, gathered, under peft's saved names (small: a
    rank-8 adapter of a 7B model is tens of MB)."""
    return split_live_state(dict(gathered_parameters(model, "adapter")))[1]


def _groups(model: torch.nn.Module, base_only: bool) -> list[tuple[str, list[str]]]:
    """The model's state dict as (first checkpoint name, live names) per module, sorted by
    checkpoint name: `state_checksum`'s order, and a LoRA module's base and adapter
    together so they merge where gathered. A tied weight once. `base_only`: a peft
    model's base alone (its adapter's live names left out)."""
    live = list(model.state_dict())
    if base_only:
        live = [name for name in live if ".lora_" not in name]
    checkpoint = split_live_state({name: name for name in live})[0]  # checkpoint name → live name
    tied = tied_weight_names(model)
    first = {live_name: name for name, live_name in checkpoint.items() if name not in tied}
    modules: dict[str, list[str]] = {}
    for name in live:
        if name in first or ".lora_" in name:
            modules.setdefault(_module_of(name), []).append(name)
    keyed = []
    for names in modules.values():
        own = sorted(first[n] for n in names if n in first)
        if own:  # an adapter whose base is tied away would have none: there is no such model
            keyed.append((own[0], names))
    return sorted(keyed)


def sorted_gathers(model: torch.nn.Module, base_only: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """The model's state dict one module at a time, whole ({live name: tensor}), in
    checkpoint-name order: a sharded tensor all-gathered (`DTensor.full_tensor`, a
    collective: every rank of the pool iterates this in step), any other a view. What a
    streamed checksum or model directory reads; a rank holds one module's tensors at a
    time, and what it keeps is the reader's to decide."""
    from torch.distributed.tensor import DTensor

    state = model.state_dict()
    with torch.no_grad():
        for _, names in _groups(model, base_only):
            piece = {}
            for name in names:
                t = state[name]
                piece[name] = t.full_tensor() if isinstance(t, DTensor) else t.detach()
            yield piece
            piece = {}  # not held while the next module is gathered


def effective_stream(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of the policy the model computes (LoRA merged, a tied
    weight once), in name order, gathered module by module (`sorted_gathers`): the
    order and form `state_checksum` and a model directory take."""
    for piece in sorted_gathers(model):
        items = sorted(effective_live_state(piece, model).items())
        piece.clear()
        yield from _handed_over(items)


def base_stream(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft model's frozen base under checkpoint names, in name order, gathered module
    by module (its adapter is not gathered)."""
    for piece in sorted_gathers(model, base_only=True):
        items = sorted(untied(split_live_state(piece)[0], model).items())
        piece.clear()
        yield from _handed_over(items)


def _handed_over(items: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `items`, keeping none once yielded: a tensor the reader has written and
    dropped is freed before the next module is gathered."""
    items.reverse()
    while items:
        yield items.pop()


def streamed_checksum(model: torch.nn.Module) -> str:
    """`state_checksum` of the policy the model computes, taken a module at a time as
    `effective_stream` gathers it (a collective for a sharded model: the pool's other
    ranks `drain` the same stream)."""
    hasher = StateHasher()
    for name, tensor in effective_stream(model):
        hasher.add(name, tensor)
        del tensor  # not held while the next module is gathered
    return hasher.hexdigest()


def drain(stream: Iterator) -> None:
    """Run a stream for its collectives alone (ranks 1.. of a sharded pool, while rank
    0 reads the same stream)."""
    for item in stream:
        del item  # not held while the next one is gathered
