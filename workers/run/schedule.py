"""A run's schedule: the order of events that decides what an async run trains, recorded
as it goes so that a replay of the same config can force it.

With the seeds fixed and every matmul rounding the same way (the run actors' MKL mode,
workers/core/worker_process.py), what an async run trains depends on two things the
host's speed decides:

- **the version each generate call starts on**: an inference worker loads the newest
  weights staged before each call, so a faster trainer means newer weights;
- **which groups make each batch**: the trainer takes the oldest fresh groups in the
  buffer when it asks, and groups arrive from several workers in whatever order they end.

Both pass through the buffer actor: every call starts with an admission (the worker and
the version it holds) and every batch is one `get` (the version it will train at). So
the buffer records them (`ScheduleRecorder`): each admission as (worker, version, groups)
and each batch as (version, group ids in the order trained). The groups' ids derive from
the calls' seeds, and each worker draws its rows in the same order given the same
admissions, so nothing else is needed. A replay (`ScheduleReplay`) gives the buffer the
recorded schedule and the buffer enforces it:

- an admission waits (answers 0, as the gate does when a worker is too far ahead) until
  the worker holds the version its next recorded call started on, then admits the
  recorded number of groups;
- a batch is taken once every one of its recorded groups is in the buffer, exactly those,
  in order; the trainer trains it (and so publishes newer weights) only once every call
  recorded at a version up to its own has been admitted, so no worker is left needing a
  version the newer one has replaced. Taking and training are apart because the trainer
  asks for its next batch before it trains the one at hand (the prefetch): the recorded
  run may have taken batch v+1, freeing the room a worker's finished call was waiting
  for, before that worker's call on version v+1 started; a replay that held the take
  until that call started would wait for a call that waits for the take.

A replay that cannot follow its schedule (a worker already holding a newer version
than its call's, a recorded group rejected as stale) raises `ReplayDiverged`, naming the
call or batch: the run fails with that sentence rather than training something else.

Under the stepped update modes (`sync.update_mode` in_flight, abort_resume, abort_retry)
a third thing is the host's: **where inside a call new weights load**. A worker takes
staged weights between two decode steps, so the tokens after that step (and, aborting,
the rows it restarts) come from the newer version. The worker counts its decode steps per
call and tells the buffer of each load (`RecordedUpdates`): the schedule records it as
(worker, call, decode step, version). A replayed call loads at exactly those steps
(`ReplayedUpdates`): at a recorded step it waits until the recorded version is staged,
at any other it loads nothing; and a batch at version v is also trained only once every
load of a version up to v has happened, so the trainer publishes nothing newer before
then (a worker stages the newest version only).

Under `buffer.on_stale: requeue`, the prompts of groups rejected as stale go to whichever
call asks next, and which call that is is the host's timing as well. The buffer records
each call's take (worker, call, group ids); a replayed call takes exactly those groups,
waiting until each has been put, and requeues one still in the buffer at once: the
record says it was requeued, and no replayed batch takes it.

What this does not cover, refused when the run starts (`replay_problem`): episodes on
their own clocks (their scheduler admits them). A record the config at hand could not
follow is refused there too, before any actor starts (`schedule_problem`): calls of more
inference workers than it has, batches of another size, loads inside calls under
`drain`, requeued takes without `on_stale: requeue`, or a record that does not start
where the replay does.

A resumed run records the steps it ran, from its checkpoint on; its replay resumes from
the same checkpoint (the weights, optimizer, RNG, buffer and rows in flight it restored)
and follows the record from there.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.config.run_config import RunConfig
from workers.rollout.partial_rollouts import WeightUpdates


class ReplayDiverged(RuntimeError):
    """The replayed run could not follow its recorded schedule (module docstring)."""


@dataclass(frozen=True)
class Admission:
    """One generate call's start: worker `worker` holding `version` started `groups` groups."""

    worker: int
    version: int
    groups: int


@dataclass(frozen=True)
class Batch:
    """One trainer step's batch: taken at policy `version` (it trains version → version+1),
    its groups' ids in the order trained."""

    version: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True)
class Load:
    """New weights loaded inside a generate call: worker `worker`'s call `call` (its
    calls counted from 0, as its admissions) loaded `version` after decode step `step`
    (counted from 1 over the call, across the sessions an abort restarts)."""

    worker: int
    call: int
    step: int
    version: int


@dataclass(frozen=True)
class Requeue:
    """Worker `worker`'s call `call` took the stale groups `group_ids` to generate their
    prompts again (buffer.on_stale 'requeue')."""

    worker: int
    call: int
    group_ids: tuple[str, ...]


@dataclass
class Schedule:
    """A run's admissions, batches, loads inside calls and requeued takes, each in the
    order they happened."""

    admissions: list[Admission] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    requeues: list[Requeue] = field(default_factory=list)

    @property
    def starts_at(self) -> int:
        """The policy version its first batch trains: 0, or the step of the checkpoint
        the recorded run resumed from (0 for a record of no batch)."""
        return self.batches[0].version if self.batches else 0

    def to_json(self) -> dict:
        return {
            "admissions": [[a.worker, a.version, a.groups] for a in self.admissions],
            "batches": [[b.version, list(b.group_ids)] for b in self.batches],
            "loads": [[x.worker, x.call, x.step, x.version] for x in self.loads],
            "requeues": [[r.worker, r.call, list(r.group_ids)] for r in self.requeues],
        }

    @classmethod
    def from_json(cls, data: dict) -> Schedule:
        """The schedule `to_json` wrote (one without "loads" or "requeues" has none);
        ValueError naming what is malformed."""
        try:
            admissions = [Admission(int(w), int(v), int(n)) for w, v, n in data["admissions"]]
            batches = [Batch(int(v), tuple(str(g) for g in ids)) for v, ids in data["batches"]]
            loads = [Load(int(w), int(c), int(k), int(v)) for w, c, k, v in data.get("loads", [])]
            requeues = [Requeue(int(w), int(c), tuple(str(g) for g in ids)) for w, c, ids in data.get("requeues", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"a schedule is {{'admissions': [[worker, version, groups], ...], 'batches': "
                f"[[version, [group id, ...]], ...], 'loads': [[worker, call, step, version], ...], "
                f"'requeues': [[worker, call, [group id, ...]], ...]}}: {exc}"
            ) from None
        return cls(admissions, batches, loads, requeues)

    def size_bytes(self) -> int:
        """Its size as compact JSON: what keeping it with the run costs."""
        return len(json.dumps(self.to_json(), separators=(",", ":")))

    def bytes_per_step(self) -> float:
        return self.size_bytes() / max(1, len(self.batches))

    def __repr__(self) -> str:
        return f"Schedule({len(self.admissions)} admissions, {len(self.batches)} batches)"


class ScheduleRecorder:
    """What the buffer records as a run goes (not thread-safe: the buffer actor calls it
    under its own lock)."""

    def __init__(self) -> None:
        self.schedule = Schedule()

    def admitted(self, worker: int, version: int, groups: int) -> None:
        if groups > 0:  # a refused admission started nothing
            self.schedule.admissions.append(Admission(worker, version, groups))

    def took(self, version: int, group_ids: list[str]) -> None:
        self.schedule.batches.append(Batch(version, tuple(group_ids)))

    def loaded(self, load: Load) -> None:
        self.schedule.loads.append(load)

    def requeued(self, take: Requeue) -> None:
        if take.group_ids:  # a call that took nothing requeued is no event
            self.schedule.requeues.append(take)


class ScheduleReplay:
    """The buffer's side of a replay: what each admission and batch must be (module
    docstring). Not thread-safe: the buffer actor calls it under its own lock."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._calls: dict[int, deque[tuple[int, Admission]]] = defaultdict(deque)
        for i, a in enumerate(schedule.admissions):
            self._calls[a.worker].append((i, a))
        # Recorded admissions not yet made, by version: the batch at version v is not
        # trained while any at v or earlier is left (no scan of the record per ask).
        self._left: Counter[int] = Counter(a.version for a in schedule.admissions)
        self._batches = deque(enumerate(schedule.batches))
        # Recorded loads inside calls not yet made, per worker in order and by version
        # (the batch at version v is not trained while any of v or earlier is left).
        self._loads: dict[int, deque[Load]] = defaultdict(deque)
        for x in schedule.loads:
            self._loads[x.worker].append(x)
        self._loads_left: Counter[int] = Counter(x.version for x in schedule.loads)
        self._requeues = {(r.worker, r.call): r.group_ids for r in schedule.requeues}

    def requeued_for(self, worker: int, call: int) -> tuple[str, ...]:
        """The stale groups worker `worker`'s call `call` took to generate again (none: ())."""
        return self._requeues.get((worker, call), ())

    def loads_of(self, worker: int) -> dict[int, list[tuple[int, int]]]:
        """Worker `worker`'s recorded loads inside its calls: {call: [(step, version), ...]}."""
        calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for x in self.schedule.loads:
            if x.worker == worker:
                calls[x.call].append((x.step, x.version))
        return dict(calls)

    def loaded(self, load: Load) -> None:
        """Worker `load.worker` loaded weights inside a call; ReplayDiverged unless it is
        that worker's next recorded load."""
        expected = self._loads[load.worker]
        if not expected or expected[0] != load:
            want = f"{expected[0]}" if expected else "none"
            raise ReplayDiverged(
                f"replay diverged: inference worker {load.worker} made {load}; the record's next is {want}"
            )
        expected.popleft()
        self._loads_left[load.version] -= 1

    def admit(self, worker: int, version: int, want: int) -> int:
        """The groups worker `worker`, holding `version`, may start now: 0 until it holds
        its next call's version, then that call's groups. ReplayDiverged if it holds a
        newer version, asks for fewer groups than the call started, or has no call left."""
        calls = self._calls[worker]
        if not calls:
            return 0  # its recorded calls are all made: the run ends with the batches
        i, call = calls[0]
        if version < call.version:
            return 0
        if version > call.version or want < call.groups:
            raise ReplayDiverged(
                f"replay diverged at admission {i}: inference worker {worker} holds policy version {version} "
                f"and asks for {want} groups; the recorded call started {call.groups} on version {call.version}"
            )
        calls.popleft()
        self._left[call.version] -= 1
        return call.groups

    def next_batch(self, version: int) -> tuple[int, Batch]:
        """The recorded batch the trainer's next get takes, asked at `version`.
        ReplayDiverged if the trainer asks at another version or past the record."""
        if not self._batches:
            raise ReplayDiverged(
                f"replay diverged: the trainer asks for a batch at policy version {version}, "
                f"past the {len(self.schedule.batches)} recorded"
            )
        k, batch = self._batches[0]
        if batch.version != version:
            raise ReplayDiverged(
                f"replay diverged at batch {k}: the trainer asks at policy version {version}, "
                f"the recorded batch was taken at {batch.version}"
            )
        return k, batch

    def untrainable(self, version: int) -> str | None:
        """What the batch at `version` still waits for before the trainer may train it
        (and then publish version + 1), a phrase; None once every call recorded at a
        version up to `version` is admitted and every load of such a version made."""
        calls = sum(n for v, n in self._left.items() if v <= version)
        loads = sum(n for v, n in self._loads_left.items() if v <= version)
        if not calls and not loads:
            return None
        return (
            f"{calls} recorded call(s) on policy version {version} or earlier to start and "
            f"{loads} recorded load(s) of such a version inside a call"
        )

    def taken(self) -> None:
        """The batch `next_batch` gave was taken."""
        self._batches.popleft()


def replay_problem(cfg: RunConfig, multi_agent: bool) -> str | None:
    """Why a run of `cfg` (its task multi-agent or not) cannot be replayed from its
    schedule, a sentence naming the field; None if it can."""
    if multi_agent or cfg.buffer.unit == "episode":
        return (
            "episodes run on their own clocks (a multi-agent task, or buffer.unit 'episode'), which a schedule "
            "does not record: replay covers single-turn groups only"
        )
    return None


def schedule_problem(schedule: Schedule, cfg: RunConfig, resume_step: int = 0) -> str | None:
    """Why a run of `cfg` resumed at `resume_step` (0: from the start) could not follow
    `schedule`, a sentence naming the field and the fix; None if it could. A replay would
    otherwise start every actor and fail at the first event it cannot make
    (ReplayDiverged)."""
    first = schedule.starts_at if schedule.batches else resume_step
    if first != resume_step:
        if resume_step:
            return (
                f"its first batch trains policy version {first}, and the checkpoint it would resume from is of "
                f"step {resume_step}: a replay resumes from the checkpoint its recorded run resumed from"
            )
        return (
            f"its first batch trains policy version {first}, not 0: the recorded run resumed from the "
            f"checkpoint of step {first}, so its replay resumes from that checkpoint too (resume_from)"
        )
    workers = {a.worker for a in schedule.admissions} | {x.worker for x in schedule.loads}
    workers |= {r.worker for r in schedule.requeues}
    if workers and max(workers) >= cfg.inference.num_workers:
        return (
            f"the schedule has calls of inference worker {max(workers)}, and inference.num_workers is "
            f"{cfg.inference.num_workers}: set it to {max(workers) + 1}, as the recorded run had"
        )
    sizes = {len(b.group_ids) for b in schedule.batches} - {cfg.trainer.batch_groups}
    if sizes:
        return (
            f"the schedule's batches hold {min(sizes)} groups, and trainer.batch_groups is "
            f"{cfg.trainer.batch_groups}: set it as the recorded run had"
        )
    if schedule.loads and cfg.sync.update_mode == "drain":
        return (
            "the schedule loads weights inside generate calls, and sync.update_mode 'drain' loads them only "
            "between calls: use the recorded run's update mode (in_flight, abort_resume or abort_retry)"
        )
    if schedule.requeues and cfg.buffer.on_stale != "requeue":
        return (
            f"the schedule's calls take requeued prompts, and buffer.on_stale is '{cfg.buffer.on_stale}': "
            "set it to 'requeue', as the recorded run had"
        )
    return None


def schedule_json(schedule: Schedule) -> dict:
    """`schedule` as JSON data with its size (bytes, bytes_per_step)."""
    return {**schedule.to_json(), "bytes": schedule.size_bytes(), "bytes_per_step": schedule.bytes_per_step()}


# How long a replayed call waits at a recorded load for its version to be staged before it
# calls the replay stuck: far past a trainer step on a loaded host.
LOAD_WAIT_LIMIT_S = 600.0
# How long the trainer waits, a batch taken, for the calls and loads the record has before
# it is trained (ScheduleReplay.untrainable), before it calls the replay stuck: at most a
# worker's generate call (the next call starts once the last is put), the bound the buffer
# actor's wait for requeued groups assumes too.
TRAIN_WAIT_LIMIT_S = 600.0


class RecordedUpdates:
    """A generate call's WeightUpdates (workers/rollout/partial_rollouts.py) that counts
    its decode steps (generation asks `pending` once after each) and reports each load
    to `report(step, version)`."""

    def __init__(self, updates: WeightUpdates, report: Callable[[int, int], None]) -> None:
        self.updates, self.report = updates, report
        self.step = 0

    def pending(self) -> bool:
        self.step += 1
        return self.updates.pending()

    def apply(self) -> int:
        version = self.updates.apply()
        self.report(self.step, version)
        return version


class ReplayedUpdates:
    """A replayed call's WeightUpdates: weights load after exactly the recorded decode
    steps (`loads`: [(step, version), ...] in order), each once `staged_version()` says
    that version is staged, and after no other step. `stopping` ends a wait (the run
    stops); each load is reported as RecordedUpdates reports it."""

    def __init__(
        self,
        updates: WeightUpdates,
        staged_version: Callable[[], int | None],
        loads: list[tuple[int, int]],
        report: Callable[[int, int], None],
        stopping: threading.Event,
        poll_s: float = 0.05,
    ) -> None:
        self.updates, self.staged_version, self.report = updates, staged_version, report
        self.loads = deque(loads)
        self.stopping, self.poll_s = stopping, poll_s
        self.step = 0

    def pending(self) -> bool:
        self.step += 1
        if not self.loads or self.loads[0][0] != self.step:
            return False
        want = self.loads[0][1]
        deadline = time.monotonic() + LOAD_WAIT_LIMIT_S
        while (staged := self.staged_version()) is None or staged < want:
            if self.stopping.wait(self.poll_s):
                return False
            if time.monotonic() > deadline:
                raise ReplayDiverged(
                    f"replay stuck: version {want}, recorded as loaded after decode step {self.step}, "
                    f"was not staged within {LOAD_WAIT_LIMIT_S:.0f} s"
                )
        if staged != want:
            raise ReplayDiverged(
                f"replay diverged: version {staged} is staged where the record loaded {want} "
                f"after decode step {self.step}"
            )
        return True

    def apply(self) -> int:
        step, want = self.loads.popleft()
        version = self.updates.apply()
        if version != want:
            raise ReplayDiverged(
                f"replay diverged: loading after decode step {step} gave version {version}, the record {want}"
            )
        self.report(step, version)
        return version

    def finished(self) -> None:
        """The call ended: ReplayDiverged if a recorded load was not reached."""
        if self.loads:
            step, version = self.loads[0]
            raise ReplayDiverged(
                f"replay diverged: the call ended after {self.step} decode steps, before its recorded "
                f"load of version {version} after step {step}"
            )
