"""The discrete-event loop: a clock and a queue of (time, order, action).

Actions scheduled for the same instant run in the order they were scheduled, so a run
is a pure function of its inputs (and its seed).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0
        self.events = 0  # actions run

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run `action` at time `t` (never before now)."""
        self._order += 1
        heapq.heappush(self._queue, (max(t, self.now), self._order, action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.at(self.now + delay, action)

    def run(self, until: Callable[[], bool]) -> None:
        """Run actions in time order until `until()` is true or none is left."""
        queue = self._queue
        while queue and not until():
            t, _, action = heapq.heappop(queue)
            self.now = t
            self.events += 1
            action()
