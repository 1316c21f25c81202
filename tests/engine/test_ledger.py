"""The prompt ledger (workers/run/ledger.py): rows in flight carried by a checkpoint, a
group put between the two reads of a snapshot counted once, and totals that close."""

from __future__ import annotations

import random
import threading

import pytest

from tests.engine.test_buffer import group
from workers.config.run_config import RunConfig
from workers.core.records import group_id
from workers.rollout.partial_rollouts import PartialCounts
from workers.rollout.task_data import DatasetPrompts
from workers.run.buffer import RolloutBuffer, with_prefetched
from workers.run.inference_host import InferenceHost
from workers.run.ledger import InFlight, LedgerTotals, carried, resume_parts


def new_worker(index: int = 0, rows: int = 100):
    """An inference worker outside Ray, with no engine: the state its drawing, its
    checkpoint state and its puts read, drawing from dataset rows `w<index>-row<i>`
    (enough that none is drawn twice here)."""
    worker = object.__new__(InferenceHost)
    worker.cfg = RunConfig.model_validate({"seed": 3})
    worker.index, worker.calls, worker.version, worker.evaluated = index, 0, 0, 0
    worker.prompts = DatasetPrompts([(f"w{index}-row{i}", "a") for i in range(rows)])
    worker.rng, worker.partial, worker.drawn, worker.in_flight = random.Random(0), PartialCounts(), 0, InFlight()
    worker._carried, worker._draw_lock, worker._stop = [], threading.Lock(), threading.Event()
    return worker


def put(buffer: RolloutBuffer, worker, seed: int, rows: list, version: int = 0) -> None:
    """The groups of a call's `rows` into `buffer`, then settled as the worker's `_put` does."""
    for i, (prompt, answer) in enumerate(rows):
        g = group(group_id(seed, i), version)
        g.prompt, g.answer = prompt, answer
        buffer.put(g)
    worker.in_flight.settle([group_id(seed, i) for i in range(len(rows))])


def test_in_flight_rows_are_kept_by_their_groups_ids_until_settled():
    rows = InFlight()
    rows.add(7, [("p0", "a0"), ("p1", "a1")])
    assert rows.state() == [["7-0", "p0", "a0"], ["7-1", "p1", "a1"]] and len(rows) == 2
    rows.settle(["7-0", "9-9"])
    assert rows.state() == [["7-1", "p1", "a1"]]


def test_a_row_put_between_the_two_reads_is_in_the_buffer_only_and_the_totals_close():
    buffer = RolloutBuffer(capacity_groups=None, max_staleness=0)
    w = new_worker()
    seed, rows = w._draw(3, [])
    put(buffer, w, seed, rows[:1])
    workers = [w.state_dict()]  # the checkpoint reads the worker: rows 1 and 2 in flight
    g = group(group_id(seed, 1))
    g.prompt, g.answer = rows[1]
    buffer.put(g)  # row 1 reaches the buffer before the buffer is read, its settle after
    state = buffer.state_dict()
    assert carried(workers[0], set(state["received_ids"])) == [rows[2]]
    totals = LedgerTotals.of(workers, state)
    assert (totals.drawn, totals.waiting, totals.in_flight, totals.unaccounted) == (3, 2, 1, 0)


def test_totals_close_through_training_drops_requeues_and_a_resume():
    buffer = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    w = new_worker()
    seed, rows = w._draw(4, [])
    put(buffer, w, seed, rows, version=0)
    assert len(buffer.get(2, current_version=0)) == 2  # trained
    # Version 1: the two left are stale and go back; one is taken to be generated again.
    seed2, rows2 = w._draw(2, [])
    put(buffer, w, seed2, rows2, version=1)
    assert len(buffer.get(1, current_version=1)) == 1
    again = buffer.take_requeued(1)
    w._draw(1, again)  # being generated again: in flight, not drawn again
    seed3, rows3 = w._draw(2, [])  # drawn, not yet put
    snapshot = ([w.state_dict()], buffer.state_dict())
    totals = LedgerTotals.of(*snapshot)
    assert totals == LedgerTotals(
        drawn=8, trained=3, dropped_stale=0, dropped_uniform=0, waiting=1, requeued_waiting=1, in_flight=3
    )
    assert totals.unaccounted == 0
    # Resumed: the rows in flight come back first, the fresh ones after them.
    ((state, rows_back),) = resume_parts(*snapshot, num_workers=1)
    assert rows_back == [(g.prompt, g.answer) for g in again] + rows3
    resumed = new_worker()
    resumed.load_state_dict(state, rows_back)
    restored = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    restored.load_state_dict(snapshot[1])
    seed4, rows4 = resumed._draw(4, [])
    assert rows4[:3] == rows_back and rows4[3] == ("w0-row8", "a")
    put(restored, resumed, seed4, rows4, version=1)
    assert LedgerTotals.of([resumed.state_dict()], restored.state_dict()).unaccounted == 0


def test_the_trainers_prefetched_batch_counts_as_waiting_not_trained():
    buffer = RolloutBuffer(capacity_groups=None, max_staleness=1)
    w = new_worker()
    seed, rows = w._draw(4, [])
    put(buffer, w, seed, rows)
    prefetched = buffer.get(2, current_version=0)
    totals = LedgerTotals.of([w.state_dict()], with_prefetched(buffer.state_dict(), prefetched))
    assert (totals.trained, totals.waiting, totals.unaccounted) == (0, 4, 0)


def test_uniform_groups_dropped_by_dynamic_sampling_are_accounted():
    buffer = RolloutBuffer(capacity_groups=None, max_staleness=0, drop_uniform=True)
    w = new_worker()
    seed, rows = w._draw(2, [])
    put(buffer, w, seed, rows)  # `group` gives every rollout reward 0: uniform
    totals = LedgerTotals.of([w.state_dict()], buffer.state_dict())
    assert (totals.dropped_uniform, totals.waiting, totals.unaccounted) == (2, 0, 0)
    assert totals.metrics()["ledger/dropped_uniform"] == 2.0 and totals.metrics()["ledger/unaccounted"] == 0.0


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_a_resume_with_another_number_of_workers_loses_no_row(num_workers):
    buffer = RolloutBuffer(capacity_groups=None, max_staleness=0)
    workers = [new_worker(i) for i in range(2)]
    for w in workers:
        w._draw(2, [])  # all in flight
    states = [w.state_dict() for w in workers]
    parts = resume_parts(states, buffer.state_dict(), num_workers)
    assert len(parts) == num_workers
    assert sum(len(rows) for _, rows in parts) == 4
    assert sum(state["drawn"] for state, _ in parts if state is not None) == 4
    assert [state is None for state, _ in parts] == [False, False, True][:num_workers]


def test_an_inference_worker_draws_carried_rows_first_and_settles_rows_as_the_buffer_takes_them(monkeypatch):
    """The worker's own code (outside Ray, no engine): a call's rows are in flight from
    the draw to the buffer; a resumed worker generates the rows its checkpoint carried
    (less those the buffer received) before it draws fresh ones, and does not count them
    as drawn again."""
    from workers.core.timeline import Timeline
    from workers.run import inference_host

    rows = [(f"w0-row{i}", "a") for i in range(4)]
    worker = new_worker()
    seed, drawn = worker._draw(3, [])
    assert drawn == rows[:3] and worker.drawn == 3 and len(worker.in_flight) == 3
    state = worker.state_dict()
    assert [gid for gid, _, _ in state["in_flight"]] == [group_id(seed, i) for i in range(3)]

    # The buffer received the call's first group before it was read.
    resumed = new_worker()
    resumed.load_state_dict(state, carried(state, {group_id(seed, 0)}))
    stale = group("old")
    stale.prompt, stale.answer = "stale", "s"
    seed2, again = resumed._draw(4, [stale])
    assert again == [("stale", "s"), rows[1], rows[2], rows[3]]  # requeued, carried, then fresh
    assert resumed.drawn == 4

    class Put:  # the buffer actor's `put` handle: takes two groups, and the run stops
        def remote(self, groups, timeout):
            resumed._stop.set()
            return (2, 0.0)

    resumed.buffer = type("Buffer", (), {"put": Put()})()
    resumed.receiver, resumed.timeline = type("Receiver", (), {"blocks_sender": False})(), Timeline()
    monkeypatch.setattr(inference_host.ray, "get", lambda answer: answer)
    resumed._put([group(group_id(seed2, i)) for i in range(4)])
    # What the buffer took is settled; the rest stays in flight (a checkpoint carries it).
    assert [gid for gid, _, _ in resumed.state_dict()["in_flight"]] == [group_id(seed2, 2), group_id(seed2, 3)]
