"""What a weight sync says between processes: the `Notice` a trainer's sender hands every
inference worker, and the `SyncReport` each side makes of one sync (workers/sync/base.py
says how the two halves of a sync use them).

In core, not in the sync package: these records reach processes that move no weights (a
run's driver reads the reports), and unpickling one imports its module's package, whose
protocols import torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

NAN = math.nan


@dataclass
class SyncReport:
    """One sync, from one side or combined. Fields a side cannot know are NaN."""

    protocol: str
    version: int
    bytes: int
    trainer_ms: float = NAN
    inference_ms: float = NAN
    end_to_end_ms: float = NAN
    receive_ms: float = NAN  # the transfer part of inference_ms (the rest is the load)
    tensors: int = 0  # tensors moved
    messages: int = 0  # transfers (tensors, buckets, files, object-store puts)

    @staticmethod
    def combine(sent: SyncReport, received: list[SyncReport]) -> SyncReport:
        """The run's view of one version: the trainer's side plus the slowest worker."""
        bad = [r.version for r in received if r.version != sent.version]
        if bad:
            raise ValueError(f"combine: receiver reports for versions {bad}, sender's is {sent.version}")

        def worst(attr: str) -> float:
            return max((getattr(r, attr) for r in received), default=NAN)

        return SyncReport(
            protocol=sent.protocol,
            version=sent.version,
            bytes=sent.bytes,
            trainer_ms=sent.trainer_ms,
            inference_ms=worst("inference_ms"),
            end_to_end_ms=worst("end_to_end_ms"),
            receive_ms=worst("receive_ms"),
            tensors=sent.tensors,
            messages=sent.messages,
        )

    def metrics(self) -> dict[str, float]:
        """The report as metric points (workers/core/metric_names.py spelling)."""
        return {
            "sync/bytes": float(self.bytes),
            "sync/trainer_ms": self.trainer_ms,
            "sync/inference_ms": self.inference_ms,
            "sync/latency_ms": self.end_to_end_ms,
        }


@dataclass
class Notice:
    """The message from trainer to workers: which version, and where to get it.

    Small and picklable; `payload` is protocol-specific (an object ref, a directory,
    a broadcast manifest)."""

    protocol: str
    version: int
    seq: int  # 0, 1, 2 … per sender: receivers apply collectives in this order
    nbytes: int
    sent_at: float  # time.time() when `send` started: end-to-end latency starts here
    payload: dict[str, Any] = field(default_factory=dict)


Notify = Callable[[Notice], None]

# What a sender gathers from a sharded trainer: every parameter, or the LoRA adapter's.
Gathers = Literal["all", "adapter"]


def end_to_end_ms(notice: Notice) -> float:
    """Wall-clock ms from the start of the send to now (same clock on one host; across
    hosts it is as good as their clock sync)."""
    return (time.time() - notice.sent_at) * 1e3
