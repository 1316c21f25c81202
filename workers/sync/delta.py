"""Delta weight sync (`sync.delta`): per version, only the elements that changed.

In the inference workers' dtype, most of a policy's elements do not change in one RL
step: an optimizer step of lr 1e-6 moves a bf16 weight of magnitude 0.02 by far less
than its last bit (2^-7 of it, 1.6e-4), so only the weights whose float32 master crossed
a rounding boundary change. A delta holds, per tensor, the flat indices (int32) and new
values of the elements whose bits differ from the previous version's; a tensor where a
third or more changed goes whole (6 bytes an element sparse, 2 dense).

The trainer keeps the last version it sent, cast to the wire dtype (one copy of the
policy at 2 bytes a parameter), to compare against. A receiver keeps the last version it
loaded (its shadow, the same size) and rebuilds the whole state by writing a delta into
it, bit for bit what the trainer cast. Every version is also put whole, so a receiver
that is new or did not load the version a delta starts from (it skipped one, or a
resume reset it) fetches that instead: exact either way, and the bytes a caught-up
receiver pulls are the delta's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A tensor goes whole once sparse would cost as much: 4 + 2 bytes a changed element
# against 2 bytes each element.
DENSE_FROM = 1 / 3


@dataclass
class Changes:
    """One tensor's change: `values` at flat `indices`, or the whole tensor (`indices` None)."""

    indices: torch.Tensor | None
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        n = self.values.numel() * self.values.element_size()
        return n + (self.indices.numel() * self.indices.element_size() if self.indices is not None else 0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of its width: equal bits ⇔ the same value (NaNs too)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.reshape(-1).view(width)


def diff(new: torch.Tensor, old: torch.Tensor | None) -> Changes:
    """What turns `old` into `new` (the same shape and dtype), or all of `new`."""
    if old is None or old.shape != new.shape or old.dtype != new.dtype:
        return Changes(None, new)
    changed = (_bits(new) != _bits(old)).nonzero().squeeze(1)
    if changed.numel() >= DENSE_FROM * new.numel():
        return Changes(None, new)
    return Changes(changed.to(torch.int32), new.reshape(-1)[changed])


def apply(target: torch.Tensor, changes: Changes) -> None:
    """Write `changes` into `target` in place."""
    if changes.indices is None:
        target.copy_(changes.values.reshape(target.shape))
    else:
        target.view(-1)[changes.indices.long()] = changes.values


class DeltaEncoder:
    """The trainer's side: each call's state (cast to `dtype`) against the previous one's."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._sent: dict[str, torch.Tensor] = {}

    def encode(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Changes]]:
        """(the whole state in `dtype`, its changes since the previous call's)."""
        whole = {name: t.detach().to("cpu", self.dtype).contiguous() for name, t in state.items()}
        changes = {name: diff(t, self._sent.get(name)) for name, t in whole.items()}
        self._sent.update(whole)
        return whole, changes


class Shadow:
    """A receiver's copy of the last version it loaded, which deltas are written into."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.state: dict[str, torch.Tensor] = {}

    def take_whole(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.state = {name: t.clone() for name, t in state.items()}  # received buffers are read-only
        self.version = version

    def take_changes(self, version: int, changes: dict[str, Changes]) -> None:
        for name, change in changes.items():
            apply(self.state[name], change)
        self.version = version
