"""The driver's watchdog: every wait of a run's actors under a deadline of its own.

Each poll the driver hands the watchdog what every actor reports of its watched
operations (workers.core.watch: a trainer step, a weight send or load, a generate call,
a reward worker's call): the durations of those that ended, kept per actor and kind, and
the ones open now. An operation open longer than its deadline is a hang:

    deadline = clamp(watchdog.multiple × p99 of the same actor's earlier ones,
                     watchdog.floor_s, watchdog.ceiling_s)

and the ceiling alone until MIN_SAMPLES of them have ended (the first steps compile and
warm up); a weight send's is at least a generate call's (`Watchdog.send_deadline`). Both
ends of a duration are read on the actor's own clock, so hosts whose clocks disagree do
not matter. The driver turns a hang into the run's failure (kind
"hang"), naming the actor, its node and the operation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.core.watch import GENERATE, OPERATIONS, WEIGHT_SEND
from workers.run.failures import Failure

if TYPE_CHECKING:
    from workers.config.run_config import WatchdogConfig
    from workers.core.watch import WatchReport

# Below this many earlier durations a p99 says little: the deadline is the ceiling.
MIN_SAMPLES = 5
# The durations kept per actor and operation: the p99 follows a run that changes pace.
HISTORY = 512


@dataclass(frozen=True)
class Hang:
    """An operation past its deadline: `actor` (its role, as the run page names it),
    `operation`, how long it has been open, its deadline and how the deadline was set."""

    actor: str
    operation: str
    open_s: float
    deadline_s: float
    basis: str

    def message(self, node: str = "") -> str:
        where = f" on node {node}" if node else ""
        return (
            f"The {self.actor}{where} has been in its {self.operation} for {self.open_s:.0f} s, past its deadline "
            f"of {self.deadline_s:.0f} s ({self.basis}): it is stuck, so the run was stopped. Its log says where "
            "it waits; raise the watchdog section's limits if such waits are expected."
        )

    def failure(self, node: str = "") -> Failure:
        """The run's failure record (kind "hang"), `node` where the actor runs."""
        operation = f"{self.operation} (open {self.open_s:.0f} s, deadline {self.deadline_s:.0f} s)"
        return Failure("hang", self.message(node), actor=self.actor, node=node, operation=operation)


def unanswered(silent: dict[str, str], floor_s: float) -> Failure:
    """The failure of a run whose actors (`silent`: role → node, "" if unknown) did not
    answer the driver's poll within `floor_s`: stuck where even their metrics cannot be read."""
    named = ", ".join(f"{role} (node {node})" if node else role for role, node in silent.items())
    message = (
        f"The run's {named} did not answer the driver's poll within watchdog.floor_s ({floor_s:g} s): stuck "
        "where even its metrics cannot be read, so the run was stopped."
    )
    nodes = ", ".join(node for node in silent.values() if node)
    return Failure("hang", message, actor=", ".join(silent), node=nodes, operation="poll")


def p99(durations: deque[float]) -> float:
    ordered = sorted(durations)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Watchdog:
    """The deadlines of one run's operations; see the module's docstring."""

    def __init__(self, cfg: WatchdogConfig) -> None:
        self.cfg = cfg
        self._history: dict[tuple[str, str], deque[float]] = {}
        self._open: dict[str, tuple[dict[str, float], float]] = {}  # actor → (op → since, its clock now)

    def observe(self, actor: str, report: WatchReport | None) -> None:
        """Take one drain of `actor`'s watch."""
        if report is None:
            return
        for op, durations in report.durations.items():
            self._history.setdefault((actor, op), deque(maxlen=HISTORY)).extend(durations)
        self._open[actor] = (report.open, report.now)

    def deadline(self, actor: str, operation: str) -> tuple[float, str]:
        """(seconds, how they were set) for `actor`'s next or current `operation`."""
        cfg = self.cfg
        history = self._history.get((actor, operation))
        if history is None or len(history) < MIN_SAMPLES:
            done = 0 if history is None else len(history)
            return cfg.ceiling_s, f"watchdog.ceiling_s: {done} earlier {operation}s, too few to judge by"
        q = p99(history)
        raw = cfg.multiple * q
        basis = f"{cfg.multiple:g} × the p99 of its last {len(history)}, {q:.3g} s"
        if raw < cfg.floor_s:
            return cfg.floor_s, f"watchdog.floor_s; {basis}"
        if raw > cfg.ceiling_s:
            return cfg.ceiling_s, f"watchdog.ceiling_s; {basis}"
        return raw, basis

    def counts(self) -> dict[str, dict[str, int]]:
        """actor → operation → how many ended (of the last HISTORY), for the run's summary."""
        out: dict[str, dict[str, int]] = {}
        for (actor, op), history in self._history.items():
            out.setdefault(actor, {})[op] = len(history)
        return out

    def send_deadline(self, actor: str) -> tuple[float, str]:
        """A weight send's deadline: its own, or, where longer, an inference worker's
        generate call's. A send into a receiver that loads at its apply point (vLLM's
        engines) waits for the call in flight there, however quick earlier sends were."""
        own = self.deadline(actor, WEIGHT_SEND)
        workers = {a for a, op in self._history if op == GENERATE}
        calls = [self.deadline(a, GENERATE) for a in sorted(workers)]
        longest = max(calls, default=own, key=lambda d: d[0])
        if longest[0] > own[0]:
            return longest[0], f"an inference worker's generate call's, which a send may wait for: {longest[1]}"
        return own

    def check(self) -> Hang | None:
        """The first operation past its deadline (the most specific kind first), or None."""
        for actor, (open_ops, now) in self._open.items():
            for op in OPERATIONS:
                if op not in open_ops:
                    continue
                open_s = now - open_ops[op]
                deadline, basis = self.send_deadline(actor) if op == WEIGHT_SEND else self.deadline(actor, op)
                if open_s > deadline:
                    return Hang(actor, op, open_s, deadline, basis)
        return None
