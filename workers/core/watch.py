"""Operations under a deadline: what a run actor is waiting on now, and how long each
kind of wait took before.

Each run actor wraps the calls that could hang — a trainer step, a weight send, a weight
load, a generate call (with its inline reward), a reward worker's call — in `Watch.op(name)`.
The driver drains the record with the actor's metrics (`WatchReport`), and its watchdog
(workers/run/watchdog.py) holds every operation still open against a deadline derived
from the same kind's past durations: a hang becomes a failure that names the actor,
its node and the operation, instead of a run that waits forever.

HANG_ENV is the hook a test forces a hang with: "<op>:<n>" holds the n-th `<op>` of
every run actor whose process has it set until `release` (or until the run's actors are
killed, as a failed run's are), so the order of events a test needs is certain, not
hoped for.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

HANG_ENV = "ROLLWAY_TEST_HANG"

# The operations run actors watch, by name (the watchdog's sentences use these).
TRAIN_STEP = "train step"
WEIGHT_SEND = "weight send"
WEIGHT_LOAD = "weight load"
GENERATE = "generate"
SCORE = "score"
# Most specific first: a weight load taken mid-generation is inside a generate call, and
# where both outlive their deadlines the watchdog names the load.
OPERATIONS = (WEIGHT_LOAD, WEIGHT_SEND, SCORE, TRAIN_STEP, GENERATE)


@dataclass
class WatchReport:
    """One drain of a `Watch`: the operations open now (name → since, `time.time()`),
    the durations (s) of those closed since the last drain, and the actor's clock."""

    open: dict[str, float] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=dict)
    now: float = 0.0


def _hang_target() -> tuple[str, int] | None:
    spec = os.environ.get(HANG_ENV, "")
    if not spec:
        return None
    name, _, n = spec.rpartition(":")
    if name not in OPERATIONS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{HANG_ENV}={spec!r}: expected '<operation>:<n ≥ 1>', an operation of {OPERATIONS}")
    return name, int(n)


class Watch:
    """An actor's side. Thread-safe: an actor's loop and its Ray calls may each hold an
    operation open, one of each name at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, float] = {}
        self._closed: defaultdict[str, list[float]] = defaultdict(list)
        self._counts: Counter[str] = Counter()
        self._hang = _hang_target()
        self._released = threading.Event()

    @contextmanager
    def op(self, name: str) -> Iterator[None]:
        """Time `name` from entry to exit (however it exits); open while inside."""
        if name not in OPERATIONS:
            raise ValueError(f"unknown operation {name!r}: one of {OPERATIONS}")
        with self._lock:
            self._counts[name] += 1
            nth = self._counts[name]
            self._open[name] = time.time()
        try:
            if self._hang == (name, nth):
                self._released.wait()  # the forced hang: until the actor closes
            yield
        finally:
            with self._lock:
                t0 = self._open.pop(name, None)
                if t0 is not None:
                    self._closed[name].append(time.time() - t0)

    def drain(self) -> WatchReport:
        with self._lock:
            closed, self._closed = self._closed, defaultdict(list)
            return WatchReport(open=dict(self._open), durations=dict(closed), now=time.time())

    def release(self) -> None:
        """End a forced hang."""
        self._released.set()
