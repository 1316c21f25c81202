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
- a batch waits until every call recorded at a version up to its own has been admitted
  (so the trainer publishes no newer weights before those calls started on theirs) and
  every one of its recorded groups is in the buffer, and takes exactly those, in order.

A replay that cannot follow its schedule (a worker already holding a newer version
than its call's, a recorded group rejected as stale) raises `ReplayDiverged`, naming the
call or batch: the run fails with that sentence rather than training something else.

What this does not cover, refused when the run starts (`replay_problem`): weights loaded inside a
generate call (`sync.update_mode` other than 'drain': the version changes between decode
steps, which admissions do not see), stale groups' prompts generated again
(`buffer.on_stale: requeue`: which call takes them is timing too) and episodes on their
own clocks (their scheduler admits them).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from workers.config.run_config import RunConfig


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


@dataclass
class Schedule:
    """A run's admissions and batches, in the order they happened."""

    admissions: list[Admission] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "admissions": [[a.worker, a.version, a.groups] for a in self.admissions],
            "batches": [[b.version, list(b.group_ids)] for b in self.batches],
        }

    @classmethod
    def from_json(cls, data: dict) -> Schedule:
        """The schedule `to_json` wrote; ValueError naming what is malformed."""
        try:
            admissions = [Admission(int(w), int(v), int(n)) for w, v, n in data["admissions"]]
            batches = [Batch(int(v), tuple(str(g) for g in ids)) for v, ids in data["batches"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"a schedule is {{'admissions': [[worker, version, groups], ...], 'batches': "
                f"[[version, [group id, ...]], ...]}}: {exc}"
            ) from None
        return cls(admissions, batches)

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


class ScheduleReplay:
    """The buffer's side of a replay: what each admission and batch must be (module
    docstring). Not thread-safe: the buffer actor calls it under its own lock."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._calls: dict[int, deque[tuple[int, Admission]]] = defaultdict(deque)
        for i, a in enumerate(schedule.admissions):
            self._calls[a.worker].append((i, a))
        # Recorded admissions not yet made, by version: a batch at version v waits while
        # any at v or earlier is left (asked at every admission: no scan of the record).
        self._left: Counter[int] = Counter(a.version for a in schedule.admissions)
        self._batches = deque(enumerate(schedule.batches))

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

    def next_batch(self, version: int) -> tuple[int, Batch] | None:
        """The recorded batch the trainer's next get takes, if it may be taken now at
        `version`: every call recorded at a version up to `version` admitted. None while
        not; ReplayDiverged if the trainer asks at another version or past the record."""
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
        if any(n and v <= version for v, n in self._left.items()):
            return None
        return k, batch

    def taken(self) -> None:
        """The batch `next_batch` gave was taken."""
        self._batches.popleft()


def replay_problem(cfg: RunConfig, multi_agent: bool) -> str | None:
    """Why a run of `cfg` (its task multi-agent or not) cannot be replayed from its
    schedule, a sentence naming the field; None if it can."""
    if cfg.sync.update_mode != "drain":
        return (
            f"sync.update_mode {cfg.sync.update_mode!r} loads weights inside a generate call, which a schedule "
            "does not record: replay covers 'drain' runs only"
        )
    if cfg.buffer.on_stale == "requeue":
        return (
            "buffer.on_stale 'requeue' hands stale groups' prompts to whichever call asks next, which a schedule "
            "does not record: replay covers 'drop' runs only"
        )
    if multi_agent or cfg.buffer.unit == "episode":
        return (
            "episodes run on their own clocks (a multi-agent task, or buffer.unit 'episode'), which a schedule "
            "does not record: replay covers single-turn groups only"
        )
    return None


def schedule_json(schedule: Schedule) -> dict:
    """`schedule` as JSON data with its size (bytes, bytes_per_step)."""
    return {**schedule.to_json(), "bytes": schedule.size_bytes(), "bytes_per_step": schedule.bytes_per_step()}
