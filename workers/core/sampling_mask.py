"""Keep Sampling Mask: the set of tokens each completion token was drawn from.

With top-k / top-p / min-p sampling (workers/inference/sampling.py) a token is drawn
from a truncated, renormalised distribution, and its behaviour logprob mu is that
distribution's. A trainer scoring the full vocabulary compares pi over every token with
mu over the kept ones, which biases pi/mu at every token. Recording each token's kept
set and renormalising the trainer's logprobs over the same set removes the bias
(PRIME-RL carries vLLM's sampling mask the same way).

A record holds one set per completion token in compressed-sparse-row form: the ids of a
token's set follow the previous token's, `offsets` says where each starts. A set that
keeps most of the vocabulary is stored as the ids it dropped (`complement`), so no
token costs more than half the vocabulary. A token with no set (a tool token of an
episode, or sampling without truncation) is stored as an empty, non-complemented set
and trained over the full vocabulary.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Kept:
    """One sampled token's kept set as the sampler saw it: the ids (ascending) out of a
    vocabulary of `vocab` logits."""

    ids: np.ndarray
    vocab: int


@dataclass(frozen=True)
class SamplingMask:
    """What `Rollout.sampling_mask` holds: per completion token, the ids kept (or, where
    `complement` says so, dropped) when it was sampled."""

    ids: bytes  # int32, every token's ids in turn
    offsets: bytes  # int32, tokens + 1 entries
    complement: bytes  # bool, one per token
    vocab: int

    @classmethod
    def of(cls, kept: Sequence[Kept | None]) -> SamplingMask | None:
        """From each token's kept set (None: no set); None when no token has one."""
        vocab = next((k.vocab for k in kept if k is not None), None)
        if vocab is None:
            return None
        parts, offsets, complement = [], [0], []
        for k in kept:
            ids = np.zeros(0, dtype=np.int32) if k is None else np.asarray(k.ids, dtype=np.int32)
            flip = len(ids) > vocab // 2
            if flip:
                ids = np.setdiff1d(np.arange(vocab, dtype=np.int32), ids, assume_unique=True)
            parts.append(np.sort(ids))
            offsets.append(offsets[-1] + len(ids))
            complement.append(flip)
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(
            flat.astype(np.int32).tobytes(),
            np.asarray(offsets, dtype=np.int32).tobytes(),
            np.asarray(complement, dtype=np.bool_).tobytes(),
            vocab,
        )

    @property
    def tokens(self) -> int:
        return len(self.complement)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.frombuffer(self.ids, dtype=np.int32),
            np.frombuffer(self.offsets, dtype=np.int32),
            np.frombuffer(self.complement, dtype=np.bool_),
        )

    def kept(self, token: int) -> np.ndarray | None:
        """Token `token`'s kept ids, ascending; None where it has no set."""
        ids, offsets, complement = self._arrays()
        own = ids[offsets[token] : offsets[token + 1]]
        if complement[token]:
            return np.setdiff1d(np.arange(self.vocab, dtype=np.int32), own, assume_unique=True)
        return own.copy() if len(own) else None

    def dense(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """[stop − start, vocab] bool for tokens start … stop − 1 (all by default): True
        where a token may be drawn (every id for a token with no set)."""
        # torch here, not at the module's head: the records travel through processes that
        # never compute with them (a run's driver and buffer), and importing torch costs
        # each of them 2.6-3.0 s of CPU on a 2-core host. The trainer, which does, has it loaded already.
        import torch

        ids, offsets, complement = self._arrays()
        stop = self.tokens if stop is None else stop
        counts = np.diff(offsets)[start:stop]
        out = torch.zeros((stop - start, self.vocab), dtype=torch.bool)
        rows = torch.from_numpy(np.repeat(np.arange(stop - start), counts))
        out[rows, torch.from_numpy(ids[offsets[start] : offsets[stop]].astype(np.int64))] = True
        flip = torch.from_numpy(complement[start:stop] | (counts == 0))
        out[flip] = ~out[flip]
        return out

    @property
    def bytes_per_token(self) -> float:
        size = len(self.ids) + len(self.offsets) + len(self.complement)
        return size / self.tokens if self.tokens else 0.0

    def to_json(self) -> dict:
        return {
            "ids": base64.b64encode(self.ids).decode("ascii"),
            "offsets": base64.b64encode(self.offsets).decode("ascii"),
            "complement": base64.b64encode(self.complement).decode("ascii"),
            "vocab": self.vocab,
        }

    @classmethod
    def from_json(cls, data: dict) -> SamplingMask:
        return cls(
            base64.b64decode(data["ids"]),
            base64.b64decode(data["offsets"]),
            base64.b64decode(data["complement"]),
            int(data["vocab"]),
        )


@dataclass
class KeptLayout:
    """Where each row's sampling mask sits in a packed batch of `width` positions a row:
    row i's completion token j is predicted at position `starts[i] + j` (the trainer's
    `pack`), and row i's positions are flat positions i·width … (i+1)·width − 1."""

    masks: list[SamplingMask | None]
    starts: list[int]
    width: int

    def select(self, rows: torch.Tensor) -> KeptLayout:
        picked = rows.tolist()
        return KeptLayout([self.masks[r] for r in picked], [self.starts[r] for r in picked], self.width)

    def in_completions(self, width: int) -> KeptLayout:
        """The same sets in a layout of completion positions only, `width` a row
        (workers.train.shared_prefix): completion token j at position j."""
        return KeptLayout(self.masks, [0] * len(self.masks), width)

    def chunk(self, start: int, stop: int, vocab: int, device: torch.device) -> torch.Tensor:
        """[stop − start, vocab] bool for flat positions start … stop − 1: True where the
        token may be scored (every id at a position with no recorded set)."""
        import torch  # the trainer's, loaded already (see `SamplingMask.dense`)

        out = torch.ones((stop - start, vocab), dtype=torch.bool)
        for row in range(start // self.width, (stop - 1) // self.width + 1):
            mask = self.masks[row]
            if mask is None:
                continue
            if mask.vocab != vocab:
                raise ValueError(f"a sampling mask over {mask.vocab} ids cannot cut logits over {vocab}")
            first = row * self.width + self.starts[row]  # flat position of completion token 0
            lo, hi = max(start, first), min(stop, first + mask.tokens)
            if lo < hi:
                out[lo - start : hi - start] = mask.dense(lo - first, hi - first)
        return out.to(device)
