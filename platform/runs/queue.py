"""The run queue: which queued runs may start now, in what order, and why the rest wait.

A launched run stays `queued` until the scheduler (`do_schedule_queue`, the Celery task
`schedule_queue`) schedules it; only then is `launch_run` sent for it. A run is scheduled
when all of these hold:

1. fewer than `ROLLWAY_MAX_RUNNING` runs are active on the site;
2. its team has fewer active runs than its running quota (teams/quotas.py:
   `ROLLWAY_MAX_RUNNING_PER_TEAM` unless a site admin set the team's own);
3. the GPUs its team's active runs hold, with its own, stay within the team's GPU quota
   (`ROLLWAY_TEAM_MAX_GPUS`, or the team's own; unset: no cap);
4. the cluster's free resources cover what its config asks for
   (`workers.run.admission.demand`: CPUs, GPUs and an estimate of memory).

"Active" is starting, running or cancelling, plus runs scheduled but not yet claimed by
`launch_run` (queued with phase `scheduled`): they hold their place from the moment the
scheduler lets them through. "Free" is the smaller of what Ray says is available now
(other users of the cluster count) and the cluster's total less the demand of every
active run: our actors do not reserve memory in Ray, and a run scheduled a moment ago has
not placed its actors yet, so Ray's own figure alone would let two runs take one slot.

**Queue order** (`Run.objects.in_queue_order`): the teams take turns, whatever their
runs' priorities. Each next place goes to the team with the fewest runs active plus
placed so far in the order; of those, the team the queue served longest ago
(`Team.queue_served_at`, set when it schedules one of the team's runs); so a team that
queues fifty runs at the highest priority makes another team's one run wait for at most
one of them. Within a team, higher `Run.priority` first, then first come
first served: priority is how a team orders its own work, never a way past another
team. `Run.queue_position()` is the place in this order.

**Who may go past whom** — the rule that keeps any run from starving:

- a run that waits for its *team's* quota (running runs or GPUs) is passed over: its
  team's own runs are what it waits for, and it is first in line again when one of
  them ends;
- once a run waits for the *cluster*, nothing after it in the order is scheduled. Runs
  behind it that happen to fit would otherwise keep taking the CPUs, GPUs and memory it
  waits for, and a big run could wait forever behind a stream of small ones. The cost is
  some idle capacity while it waits; every run ahead of it eventually ends.
- when the site's limit is reached, nothing is scheduled.

All of the queue's state is in the Run rows (status, phase, priority, created_at), so it
survives restarts of web, worker and beat: the scheduler runs after every launch, after
every run that ends, and from reconcile on every beat.

**Concurrency.** Two schedulers running at once could each count one free slot and
schedule two different runs. Each pass therefore runs in one transaction holding a lock
that serializes schedulers: a PostgreSQL transaction-level advisory lock (any number of
worker processes), or on other databases (the embedded SQLite setup runs one worker
process) a process-wide lock. Scheduling a run is also a conditional UPDATE (queued and
not yet scheduled), so a run is never scheduled twice.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from foundation.fields import max_length
from runs import dispatch, events, in_ray
from runs.models import Run
from teams import quotas
from teams.models import Team
from workers.run.admission import Capacity, Demand, capacity_errors, demand
from workers.run.failures import explain

logger = logging.getLogger(__name__)

Status = Run.Status

# Run.phase of a queued run: waiting for the scheduler, or scheduled and waiting for a
# worker to claim it (launch_run: queued → starting).
WAITING = Run.QUEUE_WAITING
SCHEDULED = Run.QUEUE_SCHEDULED
SCHEDULED_DETAIL = Run.QUEUE_SCHEDULED_DETAIL
NOT_SEEN = Run.QUEUE_NOT_SEEN
# Any fixed 64-bit number: the PostgreSQL advisory lock that one scheduler holds at a time.
ADVISORY_LOCK_KEY = 0x526F6C6C51  # "RollQ"
# A detail is at most this long (Run.phase_detail).
DETAIL_MAX = max_length(Run, "phase_detail")

_process_lock = threading.Lock()


def active_runs():
    """Runs that hold a slot: starting, running, cancelling, or scheduled and not yet claimed."""
    return Run.objects.active()


def queued_in_order(*, configs: bool = True, active: Mapping[int, int] | None = None) -> list[Run]:
    """The queued runs in queue order (`Run.objects.in_queue_order`, the module doc says
    why), given each team's `active` runs (None: counted here); `configs=False`: without
    their config JSON."""
    runs = Run.objects.filter(status=Status.QUEUED).select_related("experiment__team")
    return (runs if configs else runs.defer("config", "overrides")).in_queue_order(active)


@dataclass(frozen=True)
class Free:
    """What the cluster can still give, as the scheduler reckons it (see the module doc)."""

    cpus: float
    memory_bytes: int
    gpus: float = 0.0

    def less(self, need: Demand) -> Free:
        return Free(self.cpus - need.cpus, self.memory_bytes - need.memory_bytes, self.gpus - need.gpus)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _runs(n: int) -> str:
    return f"{n} run is" if n == 1 else f"{n} runs are"


def _active(n: int) -> str:
    return f"{n} active run" if n == 1 else f"{n} active runs"


def cluster_shortfall(need: Demand, free: Free) -> str:
    """Why the cluster cannot give a run what it needs now ("" if it can)."""
    if need.cpus > free.cpus + 1e-9:
        return f"the cluster has {max(free.cpus, 0):.2f} of the {need.cpus:.2f} CPUs it needs free"
    if need.gpus > free.gpus + 1e-9:
        return f"the cluster has {max(free.gpus, 0):g} of the {need.gpus:g} GPUs it needs free"
    if need.memory_bytes > free.memory_bytes:
        have, want = _gib(max(free.memory_bytes, 0)), _gib(need.memory_bytes)
        return f"the cluster has {have} of the {want} of memory it needs free"
    return ""


# What each run asks of the cluster, by run and stored config (see run_demand).
_DEMANDS: dict[tuple[int, str], Demand] = {}
_DEMANDS_KEPT = 1024


def run_demand(run: Run) -> Demand:
    """What `run` asks of the cluster. Every scheduler pass reckons each active run's, and
    sizing one may read its checkpoint, tokenizer and dataset (a vLLM run on a dataset
    file: about 130 ms), while a stored config never changes: so once per run and config."""
    key = (run.pk, json.dumps(run.config, sort_keys=True))
    found = _DEMANDS.get(key)
    if found is None:
        if len(_DEMANDS) >= _DEMANDS_KEPT:
            _DEMANDS.clear()  # the active and queued runs' come back at the next pass
        found = _DEMANDS[key] = demand(run.run_config)
    return found


def free_resources(total: Capacity, available: Capacity, active: Iterable[Run]) -> Free:
    """The smaller of Ray's available resources and the total less every active run's demand."""
    free = Free(total.cpus, total.memory_bytes, total.gpus)
    for run in active:
        free = free.less(run_demand(run))
    return Free(
        cpus=min(free.cpus, available.cpus),
        memory_bytes=min(free.memory_bytes, available.memory_bytes),
        gpus=min(free.gpus, available.gpus),
    )


class Room:
    """What one scheduler pass can still give (the module doc says how it is reckoned):
    places on the site, each team's quotas, and the cluster's free resources. Made under
    the scheduler's lock, from the active runs."""

    def __init__(self, cluster: tuple[Capacity, Capacity] | str) -> None:
        self.active = list(active_runs().select_related("experiment__team"))
        self.per_team: dict[int, int] = defaultdict(int)
        self.gpus_per_team: dict[int, float] = defaultdict(float)  # counted for a team with a GPU quota
        self.quotas: dict[int, tuple[quotas.Quota, quotas.Quota]] = {}  # team → (running, GPUs)
        for run in self.active:
            self.per_team[run.experiment.team_id] += 1
        self.total: Capacity | None = None  # the cluster's total: None while Ray cannot be asked
        self.free: Free | None = None
        self.unreachable = ""  # why Ray cannot be asked
        if isinstance(cluster, str):
            self.unreachable = cluster
        else:
            self.total, self.free = cluster[0], free_resources(*cluster, self.active)
        self.blocked_by: Run | None = None  # the first run waiting for the cluster
        self.max_running = settings.ROLLWAY_MAX_RUNNING

    def team_quotas(self, team: Team) -> tuple[quotas.Quota, quotas.Quota]:
        """The team's (running, GPU) quotas; on first sight of a team with a GPU quota,
        the GPUs its active runs hold."""
        if team.pk not in self.quotas:
            self.quotas[team.pk] = quotas.quota(team, "running"), quotas.quota(team, "gpus")
            if self.quotas[team.pk][1].limit is not None:
                held = (run_demand(r).gpus for r in self.active if r.experiment.team_id == team.pk)
                self.gpus_per_team[team.pk] = sum(held)
        return self.quotas[team.pk]

    def why_wait(self, run: Run) -> str:
        """Why `run` may not start in this pass ("" if it may)."""
        team = run.experiment.team
        if len(self.active) >= self.max_running:
            return f"{_runs(len(self.active))} active (ROLLWAY_MAX_RUNNING={self.max_running})"
        if self.blocked_by is not None:
            return f"run #{self.blocked_by.pk} is ahead of it and waits for the cluster"
        running, gpus = self.team_quotas(team)
        if not running.allows(self.per_team[team.pk] + 1):
            return f"team {team.name} has {_active(self.per_team[team.pk])} ({running.source})"
        if gpus.limit is not None:
            held, need = self.gpus_per_team[team.pk], run_demand(run).gpus
            if not gpus.allows(held + need):
                return (
                    f"team {team.name}'s active runs hold {held:g} GPUs and this run needs {need:g} more "
                    f"({gpus.source})"
                )
        if self.total is None or self.free is None:
            return self.unreachable
        if capacity_errors(run.run_config, self.total):
            # It can never fit (launched before any capacity was seen): it goes, so that
            # launch_run refuses it with the reason instead of it holding the line.
            return ""
        reason = cluster_shortfall(run_demand(run), self.free)
        if reason:
            self.blocked_by = run
        return reason

    def take(self, run: Run) -> None:
        """`run` starts: it holds a place on the site and in its team, and what it needs."""
        self.active.append(run)
        self.per_team[run.experiment.team_id] += 1
        if self.team_quotas(run.experiment.team)[1].limit is not None:
            self.gpus_per_team[run.experiment.team_id] += run_demand(run).gpus
        if self.free is not None:
            self.free = self.free.less(run_demand(run))


@contextmanager
def _scheduler_lock():
    """One scheduler at a time (see the module doc); call inside a transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        yield
    else:
        with _process_lock:
            yield


def _read_cluster() -> tuple[Capacity, Capacity] | str:
    """(total, available) from Ray, or why Ray cannot be asked (logged)."""
    lifecycle = in_ray.ray_lifecycle()
    try:
        total = lifecycle.cluster_capacity(ray_address=settings.RAY_ADDRESS)
        available = lifecycle.available_capacity(ray_address=settings.RAY_ADDRESS)
    except Exception as exc:
        # Ray unreachable: scheduling a run now would only fail its launch; the next
        # pass (after a run ends, or the next beat) tries again.
        logger.warning("queue: cannot read the cluster's resources; scheduling nothing", exc_info=True)
        return explain(exc, ray_address=settings.RAY_ADDRESS, what="Asking Ray for its free resources").message
    in_ray.record_capacity(total)  # the launch check's view of the cluster stays fresh
    return total, available


def do_schedule_queue() -> list[int]:
    """Schedule every queued run that may start now (module doc) and send `launch_run` for
    each once committed; record why each other queued run waits (its phase_detail).
    Returns the ids scheduled, in queue order."""
    if not Run.objects.filter(status=Status.QUEUED).exclude(phase=SCHEDULED).exists():
        return []  # nothing waits: do not even ask Ray
    # Asked before the lock is taken: a slow Ray must not hold up other schedulers. The
    # totals may be a moment old by the time they are used; the run's own launch checks
    # again against the live cluster.
    cluster = _read_cluster()
    scheduled: list[Run] = []
    with transaction.atomic(), _scheduler_lock():
        room = Room(cluster)
        reasons: dict[int, str] = {}
        for run in queued_in_order(active=room.per_team):
            if run.phase == SCHEDULED:
                continue  # counted among the active
            reason = room.why_wait(run)
            if reason:
                reasons[run.pk] = reason[:DETAIL_MAX]
            elif _claim(run):
                room.take(run)
                scheduled.append(run)
        changed = _record_reasons(reasons, moved=bool(scheduled))
    for run in scheduled:
        transaction.on_commit(partial(_send_launch, run))
    if changed:
        positions = Run.objects.queue_positions()  # one query for every event below
        for run in changed:
            run.known_queue_position = positions.get(run.pk)
            transaction.on_commit(partial(events.send_status, run))
    if scheduled:
        logger.info("queue: scheduled runs %s", ", ".join(str(r.pk) for r in scheduled))
    return [r.pk for r in scheduled]


def _claim(run: Run) -> bool:
    """Mark `run` scheduled, unless it was cancelled since it was read; its team was
    served now (the queue's turns: `Run.objects.in_queue_order`)."""
    now = timezone.now()
    claimed = bool(
        Run.objects.filter(pk=run.pk, status=Status.QUEUED)
        .exclude(phase=SCHEDULED)
        # status_changed_at is reconcile's clock for resending a lost launch: it starts
        # now, not when the run was queued.
        .update(phase=SCHEDULED, phase_detail=SCHEDULED_DETAIL, status_changed_at=now)
    )
    if claimed:
        Team.objects.filter(pk=run.experiment.team_id).update(queue_served_at=now)
    return claimed


def _record_reasons(reasons: dict[int, str], *, moved: bool) -> list[Run]:
    """Store each waiting run's reason where it changed. Returns the waiting runs whose
    watchers should hear of it: those whose reason changed, or all of them if `moved`
    (a run ahead was scheduled, so every place in the queue changed)."""
    changed = []
    for run in (
        Run.objects.filter(pk__in=reasons, status=Status.QUEUED)
        .exclude(phase=SCHEDULED)
        .select_related("experiment__team")
    ):
        reason = reasons[run.pk]
        if (run.phase, run.phase_detail) != (WAITING, reason):
            Run.objects.filter(pk=run.pk, status=Status.QUEUED).exclude(phase=SCHEDULED).update(
                phase=WAITING, phase_detail=reason
            )
            run.phase, run.phase_detail = WAITING, reason
            changed.append(run)
        elif moved:
            changed.append(run)
    return changed


def _send_launch(run: Run) -> None:
    task_id = dispatch.send_or_log(dispatch.LAUNCH_RUN, run.pk)
    if task_id is not None:
        Run.objects.filter(pk=run.pk).update(celery_task_id=task_id)
    run.refresh_from_db()
    events.send_status(run)
