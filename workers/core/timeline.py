"""Busy/idle accounting: what each inference worker did, turned into per-step figures.

Every inference worker records time segments (`generate` with the tokens it produced,
`blocked` on a full buffer, `handoff` in its calls to the buffer) in a `Timeline`, and,
on its own track, `asleep` while its vLLM sleeps for the colocated trainer rank
(inference.sleep_level: workers/run/colocation.py). The driver drains them and, for each
trainer step's window [previous step end, this step end], computes the fraction of
inference worker time spent not generating, the token rate and the backpressure time
in that window (`StepWindows`). So every series is per trainer step, on the same x-axis
as the reward, whatever the poll interval.

Times are `time.time()`: comparable across the processes of one host (and across hosts
as far as their clocks agree).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

GENERATE = "generate"
BLOCKED = "blocked"
# Waiting for the reward pool's scores (workers/rollout/reward_stage.py): neither generating nor
# held back by the buffer.
SCORE_WAIT = "score_wait"
# Asking the buffer for admission and handing it the rollouts (the Ray calls: sending
# the groups, less any time blocked on a full buffer): per call, neither generating nor
# held back, and the part of a pipeline's step the cost of generation leaves out.
HANDOFF = "handoff"
# vLLM asleep, its GPU handed to the trainer rank sharing it: from `sleep` to waking its
# weights. A track of its own, since the loop's segments go on while it sleeps.
ASLEEP = "asleep"


@dataclass
class Segment:
    kind: str  # GENERATE | BLOCKED | SCORE_WAIT | HANDOFF | ASLEEP
    t0: float
    t1: float
    tokens: int = 0


class Timeline:
    """The inference worker's side: closed segments since the last drain, plus the one
    in progress."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed: list[Segment] = []
        self._open: tuple[str, float] | None = None
        self._asleep_since: float | None = None

    def fall_asleep(self) -> None:
        """vLLM sleeps from now (a no-op while it does)."""
        with self._lock:
            if self._asleep_since is None:
                self._asleep_since = time.time()

    def wake(self) -> None:
        """vLLM's sleep ends now: an `asleep` segment (a no-op while awake)."""
        with self._lock:
            if self._asleep_since is not None:
                self._close_sleep(time.time())
                self._asleep_since = None

    def _close_sleep(self, t1: float) -> None:
        assert self._asleep_since is not None
        if t1 > self._asleep_since:
            self._closed.append(Segment(ASLEEP, self._asleep_since, t1))

    def begin(self, kind: str) -> None:
        with self._lock:
            self._open = (kind, time.time())

    def end(self, tokens: int = 0) -> None:
        """Close the open segment (an empty one is not recorded)."""
        with self._lock:
            if self._open is None:
                raise RuntimeError("Timeline.end without a segment begun")
            kind, t0 = self._open
            self._open = None
            t1 = time.time()
            if t1 > t0:
                self._closed.append(Segment(kind, t0, t1, tokens))

    def cancel(self) -> None:
        """Drop the open segment: what it timed is not to be counted as its kind."""
        with self._lock:
            self._open = None

    def end_blocked(self, blocked_s: float) -> None:
        """Close the open segment, a call that spent `blocked_s` of it blocked on a full
        buffer: that share (its end) is recorded as `blocked`, the rest as the segment's
        own kind."""
        with self._lock:
            if self._open is None:
                raise RuntimeError("Timeline.end_blocked without a segment begun")
            kind, t0 = self._open
            self._open = None
            t1 = time.time()
            split = t1 - min(max(blocked_s, 0.0), t1 - t0)
            for part in (Segment(kind, t0, split), Segment(BLOCKED, split, t1)):
                if part.t1 > part.t0:
                    self._closed.append(part)

    def drain(self) -> tuple[list[Segment], tuple[str, float] | None, float]:
        """(closed segments since the last drain, open segment or None, now). A sleep
        still going on is closed at `now` and goes on from there, so the driver knows
        every worker's sleep up to the drain."""
        with self._lock:
            now = time.time()
            if self._asleep_since is not None:
                self._close_sleep(now)
                self._asleep_since = now
            closed, self._closed = self._closed, []
            return closed, self._open, now


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class StepWindows:
    """The driver's side: segments of all inference workers → per-window idle fraction,
    tokens/s and backpressure; and the fraction asleep, from the first `asleep` segment
    on (a run whose vLLM never sleeps has no such series)."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._segments: list[tuple[int, Segment]] = []
        self._open: dict[int, tuple[str, float] | None] = {}
        self._seen_at: dict[int, float] = {}  # when each inference worker last reported
        self._sleeps = False  # whether any worker has slept

    def report(self, worker: int, closed: list[Segment], open_seg: tuple[str, float] | None, now: float) -> None:
        for seg in closed:
            self._segments.append((worker, seg))
            self._sleeps = self._sleeps or seg.kind == ASLEEP
        self._open[worker] = open_seg
        self._seen_at[worker] = now

    def complete(self, t_end: float) -> bool:
        """Whether every inference worker's activity up to `t_end` is known: each has reported
        after `t_end` and none is still inside a segment that began before it."""
        for w in range(self.num_workers):
            if self._seen_at.get(w, 0.0) < t_end:
                return False
            seg = self._open.get(w)
            if seg is not None and seg[1] < t_end:
                return False
        return True

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """inference/idle_frac, inference/tokens_per_s, rollout/backpressure_s and
        rollout/handoff_s over [t0, t1], and inference/asleep_frac once a worker has
        slept. Call once `complete(t1)` holds."""
        span = max(t1 - t0, 1e-9)
        busy = tokens = blocked = handoff = asleep = 0.0
        for _, seg in self._segments:
            ov = _overlap(seg.t0, seg.t1, t0, t1)
            if not ov:
                continue
            if seg.kind == GENERATE:
                busy += ov
                tokens += seg.tokens * ov / max(seg.t1 - seg.t0, 1e-9)
            elif seg.kind == BLOCKED:
                blocked += ov
            elif seg.kind == HANDOFF:
                handoff += ov
            elif seg.kind == ASLEEP:
                asleep += ov
        figures = {
            "inference/idle_frac": max(0.0, 1.0 - busy / (self.num_workers * span)),
            "inference/tokens_per_s": tokens / span,
            "rollout/backpressure_s": blocked,
            "rollout/handoff_s": handoff,
        }
        if self._sleeps:
            figures["inference/asleep_frac"] = min(1.0, asleep / (self.num_workers * span))
        return figures

    def prune(self, before: float) -> None:
        """Forget segments that ended before `before` (already accounted for)."""
        self._segments = [(w, s) for w, s in self._segments if s.t1 >= before]
