"""The prompt ledger: where every row a run drew went, and the rows a checkpoint carries.

An inference worker draws rows (a dataset's, or its task generator's) for each generate
call and hands the call's groups to the buffer. Between the two the rows are in flight:
a checkpoint taken then (the trainer's, in async mode, while the workers generate)
would otherwise hold them nowhere, and a resume would skip them, its sampler having
moved past them (OpenRLHF#1322, NeMo-RL's skipped prompts). So each worker keeps its
in-flight rows under the ids their groups will have (`InFlight`), a checkpoint keeps
them with the worker's state, and the resumed worker generates them before drawing
new ones.

A checkpoint reads the workers' states, then the buffer's; a group put between the two
reads is in both. The buffer keeps the ids of the groups it received last
(`received_ids` in its state, workers/run/buffer.py `RECEIVED_IDS`), and `carried` leaves
out every in-flight row whose group the buffer already has: a row is carried, or
received, never both.

`LedgerTotals` accounts for every row drawn, from the same two states: trained (handed
to the trainer), dropped as stale, dropped as uniform (dynamic sampling), waiting in
the buffer, waiting to be generated again (stale, `on_stale="requeue"`), or in flight.
`unaccounted` is what is none of these: 0 on a consistent snapshot (a checkpoint's, or
the run's end, its loops stopped), whatever was killed and resumed in between.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass

from workers.core.records import group_id

Row = tuple[str, str]  # (prompt, answer)

# Tests set this ("1") to make every periodic checkpoint snapshot the run until an
# inference worker holds rows in flight (the trainer's `_snapshot_carrying_rows`), so that
# it carries some: otherwise whether it does depends on where the worker is when the
# trainer writes.
CHECKPOINT_IN_FLIGHT_ENV = "ROLLWAY_TEST_CHECKPOINT_ROWS_IN_FLIGHT"
# ... and fail the run, naming the switch, if none does within this long.
IN_FLIGHT_WAIT_LIMIT_S = 60.0


def checkpoint_waits_for_rows_in_flight() -> bool:
    """Whether this process runs under CHECKPOINT_IN_FLIGHT_ENV."""
    return os.environ.get(CHECKPOINT_IN_FLIGHT_ENV) == "1"


class InFlight:
    """An inference worker's rows drawn and not yet in the buffer, by group id."""

    def __init__(self) -> None:
        self._rows: dict[str, Row] = {}
        self._lock = threading.Lock()  # the loop adds and settles; a checkpoint reads

    def add(self, seed: int, rows: list[Row]) -> None:
        """The rows of a call seeded `seed`, in the order their groups are numbered."""
        with self._lock:
            for i, row in enumerate(rows):
                self._rows[group_id(seed, i)] = row

    def settle(self, group_ids: list[str]) -> None:
        """These groups reached the buffer."""
        with self._lock:
            for gid in group_ids:
                self._rows.pop(gid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def state(self) -> list[list[str]]:
        """[[group id, prompt, answer], …] (JSON data, a checkpoint's)."""
        with self._lock:
            return [[gid, p, a] for gid, (p, a) in self._rows.items()]


def carried(worker_state: dict, received_ids: set[str]) -> list[Row]:
    """The rows a worker resumed from `worker_state` generates before drawing new ones:
    those it had not begun (`carried`), then those in flight whose group the buffer
    (`received_ids`) did not receive."""
    rows = [(p, a) for p, a in worker_state.get("carried", [])]
    return rows + [(p, a) for gid, p, a in worker_state.get("in_flight", []) if gid not in received_ids]


def resume_parts(
    worker_states: list[dict], buffer_state: dict, num_workers: int
) -> list[tuple[dict | None, list[Row]]]:
    """Each of `num_workers` resumed workers' (state, carried rows) from a checkpoint's
    `worker_states` and `buffer_state`. A checkpoint of more workers than the run has
    gives the first worker the others' carried rows and drawn counts, so no row is lost
    from the ledger; a worker beyond the checkpoint's starts afresh (None)."""
    received = set(buffer_state.get("received_ids", []))
    rows = [carried(w, received) for w in worker_states]
    parts: list[tuple[dict | None, list[Row]]] = [
        (worker_states[i], rows[i]) if i < len(worker_states) else (None, []) for i in range(num_workers)
    ]
    extra = worker_states[num_workers:]
    if extra and num_workers:
        first, first_rows = parts[0]
        assert first is not None
        drawn = int(first.get("drawn", 0)) + sum(int(w.get("drawn", 0)) for w in extra)
        parts[0] = ({**first, "drawn": drawn}, first_rows + [r for more in rows[num_workers:] for r in more])
    return parts


@dataclass(frozen=True)
class LedgerTotals:
    """Where the rows a run drew are, from its workers' and its buffer's states."""

    drawn: int  # fresh rows drawn (a requeued row's regeneration is not drawn again)
    trained: int  # groups handed to the trainer
    dropped_stale: int
    dropped_uniform: int
    waiting: int  # in the buffer
    requeued_waiting: int  # stale, to be generated again
    in_flight: int  # drawn or requeued and not yet in the buffer (at the end: abandoned when it stopped)

    @property
    def unaccounted(self) -> int:
        """Rows drawn and in none of the other places: 0 on a consistent snapshot."""
        placed = self.trained + self.dropped_stale + self.dropped_uniform
        return self.drawn - placed - self.waiting - self.requeued_waiting - self.in_flight

    @classmethod
    def of(cls, worker_states: list[dict], buffer_state: dict) -> LedgerTotals:
        """From the workers' `state_dict`s and then the buffer's (the trainer's prefetched
        batch back in it, `with_prefetched`), read in that order."""
        received = set(buffer_state.get("received_ids", []))
        return cls(
            drawn=sum(int(w.get("drawn", 0)) for w in worker_states),
            trained=int(buffer_state["total_got"]),
            dropped_stale=int(buffer_state["dropped_stale"]),
            dropped_uniform=int(buffer_state.get("dropped_uniform", 0)),
            waiting=len(buffer_state["groups"]),
            requeued_waiting=len(buffer_state["requeue"]),
            in_flight=sum(len(carried(w, received)) for w in worker_states),
        )

    def metrics(self) -> dict[str, float]:
        """The totals as `ledger/*` metric values, `ledger/unaccounted` with them."""
        values = {f"ledger/{k}": float(v) for k, v in asdict(self).items()}
        values["ledger/unaccounted"] = float(self.unaccounted)
        return values
