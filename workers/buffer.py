"""The rollout buffer between inference and the trainer.

Bounded (capacity in groups), thread-safe, with backpressure: a producer blocks in
`put` while the buffer is full, which is what keeps inference from running arbitrarily
far ahead of the trainer (AReaL's admission rule, in its simplest form). Version
rejection happens at `get`: a group whose oldest token is older than
`current_version - max_staleness` is dropped and counted, never trained. Groups are the
atomic unit: a group is stored, handed out and dropped whole.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from workers.rollout import Group


class RolloutBuffer:
    """FIFO of whole groups with backpressure and staleness-based rejection."""

    def __init__(self, capacity_groups: int, max_staleness: int) -> None:
        if capacity_groups < 1:
            raise ValueError(f"RolloutBuffer capacity_groups must be ≥ 1 (got {capacity_groups})")
        if max_staleness < 0:
            raise ValueError(f"RolloutBuffer max_staleness must be ≥ 0 (got {max_staleness})")
        self._capacity = capacity_groups
        self.max_staleness = max_staleness
        self._groups: deque[Group] = deque()
        self._cond = threading.Condition()
        self._dropped_stale = 0
        self.total_put = 0
        self.total_got = 0
        self.backpressure_s = 0.0  # cumulative seconds producers spent blocked

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._groups)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dropped_stale(self) -> int:
        with self._cond:
            return self._dropped_stale

    def put(self, group: Group, timeout: float | None = None) -> float:
        """Append `group`, blocking while the buffer is full; returns seconds blocked.

        Raises queue.Full if still full after `timeout` seconds.
        """
        start = time.monotonic()
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._groups) < self._capacity, timeout):
                self.backpressure_s += time.monotonic() - start
                raise queue.Full(f"rollout buffer full ({self._capacity} groups) for {timeout}s")
            blocked = time.monotonic() - start
            self.backpressure_s += blocked
            self._groups.append(group)
            self.total_put += 1
            self._cond.notify_all()
            return blocked

    def get(self, n_groups: int, current_version: int, timeout: float | None = None) -> list[Group]:
        """Take the `n_groups` oldest fresh groups, waiting until that many are present.

        Stale groups (min_version < current_version - max_staleness) are dropped first and
        counted in `dropped_stale`. Raises queue.Empty if `n_groups` fresh groups are not
        available within `timeout` seconds (nothing is taken then).
        """
        if n_groups < 1 or n_groups > self._capacity:
            raise ValueError(
                f"get n_groups must be in 1..capacity ({self._capacity}); got {n_groups}"
            )
        oldest_ok = current_version - self.max_staleness

        def ready() -> bool:
            self._drop_stale(oldest_ok)
            return len(self._groups) >= n_groups

        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                raise queue.Empty(f"fewer than {n_groups} fresh groups after {timeout}s")
            out = [self._groups.popleft() for _ in range(n_groups)]
            self.total_got += n_groups
            self._cond.notify_all()
            return out

    def _drop_stale(self, oldest_ok: int) -> None:
        # Caller holds the lock.
        kept = deque(g for g in self._groups if g.min_version >= oldest_ok)
        dropped = len(self._groups) - len(kept)
        if dropped:
            self._dropped_stale += dropped
            self._groups = kept
            self._cond.notify_all()
