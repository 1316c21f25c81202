"""The typed messages between a run's actors and its driver.

Every POLL_S the driver (workers/run/driver.py) calls `drain_metrics` on the trainer and on
each inference worker; each answers with one report below. A trainer step's control
fields (its step and time window) travel apart from its metric values, so the driver
emits `StepRecord.metrics` as they are and reads the rest by field.

Plain stdlib dataclasses: the actors and the driver are one program on trusted ground,
so nothing is validated, and Ray pickles them like any object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.core.sync_messages import SyncReport
    from workers.core.timeline import Segment
    from workers.core.watch import WatchReport
    from workers.rollout.episode_timing import EpisodeTiming
    from workers.rollout.partial_rollouts import PartialCounts
    from workers.run.failures import Failure


@dataclass
class StepRecord:
    """One trainer step: the policy version it produced and its window of wall time
    (previous step's end → this step's end, `time.time()`), plus its metric values by
    series name (workers/core/metric_names.py), all at `step`."""

    step: int
    t0: float
    t1: float
    metrics: dict[str, float]


@dataclass
class TrainerReport:
    """The trainer's answer to `drain_metrics`: steps completed since the last drain."""

    steps: list[StepRecord]
    version: int  # the trainer's policy version now
    done: bool  # its loop has ended (max_steps reached, stopped, or failed)
    error: Failure | None  # why its loop ended, if it failed (made where it was caught)
    # workers.run.checkpoints.CheckpointRecord of each checkpoint written since the last drain
    checkpoints: list = field(default_factory=list)
    watch: WatchReport | None = None  # its steps and sends open now and those closed (workers.core.watch)


@dataclass
class EvalRecord:
    """One eval pass (workers/rollout/evaluation.py): the policy version it ran on, when it
    ended (`time.time()`), and its metric values by series name."""

    step: int
    t: float
    metrics: dict[str, float]


@dataclass
class InferenceReport:
    """An inference worker's answer to `drain_metrics`: what it did since the last drain."""

    segments: list[Segment]  # closed time segments (generate / blocked)
    open_segment: tuple[str, float] | None  # (kind, start) of the segment in progress
    now: float  # the inference worker's `time.time()` at the drain
    syncs: list[SyncReport]  # weight versions loaded, one report each
    version: int  # the policy version of the weights it holds
    error: Failure | None  # why its loop ended, if it failed (made where it was caught)
    partial: PartialCounts  # sequences aborted / resumed / retried, cumulative over the run
    evals: list[EvalRecord] = field(default_factory=list)  # eval passes since the last drain
    # A multi-agent task's episodes that ended since the last drain (workers/rollout/episode_scheduler.py)
    episodes: list[EpisodeTiming] = field(default_factory=list)
    watch: WatchReport | None = None  # its generate calls and weight loads, open and closed (workers.core.watch)
