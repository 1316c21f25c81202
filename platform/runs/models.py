"""Experiments, runs and their metric points.

The Run row is the source of truth for a run's state; Celery and Ray are reconciled to
it (runs/reconcile.py), because a run outlives the task that launched it and messages
between them get lost. Every status change goes through `Run.transition`, a conditional
UPDATE whose WHERE clause lists the states the change may come from, so concurrent
writers (the ingest view, Celery tasks, the reconciler, a user's Cancel) never
resurrect a finished run: terminal states stick.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import cached_property

from django.conf import settings
from django.db import connections, models, transaction
from django.db.models.functions import Abs
from django.urls import reverse
from django.utils import timezone

from runs import pgbulk, rollups
from teams.models import Team, TeamOwnedQuerySet
from workers.config.run_config import RunConfig
from workers.core.metric_names import TRAINED
from workers.run.reporter import PHASE_DETAIL_MAX

LEDGER_PREFIX = "ledger/"

# A checkpoint's step directory (workers/run/checkpoints.py: step-<k, 8 digits or more>).
STEP_DIR_NAME = re.compile(r"step-\d{8,}")


def new_ingest_token() -> str:
    # The default migrations/runs/0001_initial.py names; tokens are issued by
    # Run.issue_ingest_token.
    return secrets.token_urlsafe(32)


def ingest_digest(token: str) -> str:
    """What is stored of a run's ingest token. SHA-256, not a slow hash: the token is 256
    random bits, not a password a person chose."""
    return hashlib.sha256(token.encode()).hexdigest()


class Experiment(models.Model):
    """A named line of work inside a team: the runs that compare configurations."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_experiment_name")]

    def __str__(self) -> str:
        return f"{self.team} / {self.name}"


def queue_order(
    rows: Iterable[tuple[int, int, int]],
    active: Mapping[int, int] | None = None,
    served: Mapping[int, datetime | None] | None = None,
) -> list[int]:
    """The run queue's order (runs/queue.py explains why) of (run id, priority, team id)
    rows given oldest first. The teams take turns whatever their runs' priorities: each
    next place goes to the team with the fewest runs active (`active`: {team id: count})
    plus placed so far; of those, the one served longest ago (`served`: {team id: when
    the queue last scheduled one of its runs}, never first; a team just placed goes
    last), then the one whose oldest queued run came first. Within a team, higher
    priority first, then first come first served."""
    by_team: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for pk, priority, team_id in rows:
        by_team[team_id].append((priority, pk))
    active, served = active or {}, served or {}
    # Dicts keep insertion order: enumerate gives each team its place by its oldest run.
    never = datetime.min.replace(tzinfo=UTC)
    first = sorted(enumerate(by_team), key=lambda t: (served.get(t[1]) or never, t[0]))
    turns = [(active.get(team_id, 0), seq, team_id) for seq, (_, team_id) in enumerate(first)]
    heapq.heapify(turns)
    for runs in by_team.values():
        runs.sort(key=lambda run: -run[0])  # stable: first come first served within a priority
    taken = dict.fromkeys(by_team, 0)
    order: list[int] = []
    seq = len(turns)
    while turns:
        count, _, team_id = heapq.heappop(turns)
        order.append(by_team[team_id][taken[team_id]][1])
        taken[team_id] += 1
        if taken[team_id] < len(by_team[team_id]):
            heapq.heappush(turns, (count + 1, seq, team_id))
            seq += 1
    return order


class RunQuerySet(TeamOwnedQuerySet):
    team_path = "experiment__team"

    def in_flight(self) -> RunQuerySet:
        return self.exclude(status__in=Run.TERMINAL)

    def active(self) -> RunQuerySet:
        """Runs that hold a place on the site (runs/queue.py): starting, running,
        cancelling, or scheduled by the queue and not yet claimed by a worker."""
        return self.filter(
            models.Q(status__in=[Run.Status.STARTING, Run.Status.RUNNING, Run.Status.CANCELLING])
            | models.Q(status=Run.Status.QUEUED, phase=Run.QUEUE_SCHEDULED)
        )

    def active_per_team(self) -> dict[int, int]:
        """{team id: its active runs} over the whole site, in one query."""
        counted = Run.objects.active().values("experiment__team_id").annotate(n=models.Count("pk"))
        return {row["experiment__team_id"]: row["n"] for row in counted}

    def in_queue_order(self, active: Mapping[int, int] | None = None) -> list[Run]:
        """These runs in the order the run queue schedules them (`queue_order`, given
        each team's `active` runs; None: counted here). Loads each run's experiment and
        team."""
        runs = {run.pk: run for run in self.select_related("experiment__team").order_by("created_at", "pk")}
        rows = [(pk, run.priority, run.experiment.team_id) for pk, run in runs.items()]
        served = {run.experiment.team_id: run.experiment.team.queue_served_at for run in runs.values()}
        if active is None:
            active = self.active_per_team()
        return [runs[pk] for pk in queue_order(rows, active, served)]

    def queue_positions(self) -> dict[int, int]:
        """{run id: 1-based place} of the runs waiting in the queue, in queue order.
        Two queries of a few columns: cheap enough for every row of a list page."""
        waiting = self.filter(status=Run.Status.QUEUED).exclude(phase=Run.QUEUE_SCHEDULED)
        found = waiting.order_by("created_at", "pk").values_list(
            "pk", "priority", "experiment__team_id", "experiment__team__queue_served_at"
        )
        rows = [(pk, priority, team_id) for pk, priority, team_id, _ in found]
        served = {team_id: at for _, _, team_id, at in found}
        order = queue_order(rows, self.active_per_team(), served)
        return {pk: place for place, pk in enumerate(order, start=1)}


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"  # row created, launch task enqueued
        STARTING = "starting"  # claimed by the launch task; driver actor being created
        RUNNING = "running"  # the driver reported in
        CANCELLING = "cancelling"  # a user asked; the cancel task is stopping the actors
        CANCELLED = "cancelled"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Origin(models.TextChoices):
        LAUNCH = "", "launched"
        RETRY = "retry", "retry of"
        RESUME = "resume", "resumed from"
        CLONE = "clone", "clone of"
        REPLAY = "replay", "replay of"

    TERMINAL = frozenset({Status.CANCELLED, Status.SUCCEEDED, Status.FAILED})
    # The states each status may be entered from: the WHERE clause of its UPDATE. Starting
    # may be entered from queued only, so that transition is the launch's claim: of two
    # launch tasks for one run exactly one gets True.
    ALLOWED_FROM: dict[str, frozenset[str]] = {
        Status.STARTING: frozenset({Status.QUEUED}),
        Status.RUNNING: frozenset({Status.QUEUED, Status.STARTING}),
        Status.CANCELLING: frozenset({Status.QUEUED, Status.STARTING, Status.RUNNING}),
        Status.CANCELLED: frozenset({Status.QUEUED, Status.STARTING, Status.RUNNING, Status.CANCELLING}),
        # A run that finishes while its cancel is in flight keeps its real outcome.
        Status.SUCCEEDED: frozenset({Status.STARTING, Status.RUNNING, Status.CANCELLING}),
        Status.FAILED: frozenset({Status.QUEUED, Status.STARTING, Status.RUNNING, Status.CANCELLING}),
    }
    LOST_REASON = "lost: driver actor not found"
    # Run.phase of a queued run (runs/queue.py): waiting for the queue, or scheduled by it
    # and waiting for a worker to claim it (queued → starting); phase_detail says why a
    # waiting run waits, as the scheduler last saw it.
    QUEUE_WAITING = "waiting"
    QUEUE_SCHEDULED = "scheduled"
    QUEUE_SCHEDULED_DETAIL = "scheduled: a worker is starting it"
    QUEUE_NOT_SEEN = "the scheduler has not looked at it yet"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    preset = models.CharField(max_length=50)
    overrides = models.JSONField(default=dict, blank=True, help_text="What the user changed.")
    config = models.JSONField(help_text="The full, validated workers.config.run_config.RunConfig.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True)
    # The experiment trackers the run is exported to (runs/sinks): null for every one the
    # site has, else the keys its launch chose (an empty list: none).
    trackers = models.JSONField(null=True, blank=True, default=None)
    # `error` says why a run failed in a sentence or two; `error_detail` keeps what it
    # was worked out from (the failure's facts, or what reconcile saw), shown folded
    # under it. `failure` is the engine's record of it (workers.run.failures.Failure:
    # kind, actor, node, operation, the error quoted), and `error_traceback` the
    # traceback behind it, for the site's admins only: its frames name the server's files.
    error = models.TextField(blank=True)
    error_detail = models.TextField(blank=True)
    failure = models.JSONField(default=dict, blank=True)
    error_traceback = models.TextField(blank=True)
    launched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When `status` last changed: the reconciler's clock for grace periods and retries.
    status_changed_at = models.DateTimeField(default=timezone.now)
    launched_at = models.DateTimeField(null=True, blank=True, help_text="Claimed by Celery.")
    started_at = models.DateTimeField(null=True, blank=True, help_text="Driver reported running.")
    finished_at = models.DateTimeField(null=True, blank=True)
    # Authenticates the driver's reports for this run only (api/ingest.py): the hash of
    # its ingest token (`issue_ingest_token`); the clear token lives only in the memory
    # of what issued it, the run's launch for its driver.
    ingest_digest = models.CharField(max_length=64, blank=True, editable=False)
    celery_task_id = models.CharField(max_length=64, blank=True)
    ray_actor = models.CharField(max_length=100, blank=True, help_text="Detached driver actor.")
    # The run queue schedules a team's higher priorities first, first come first served
    # within one; the teams take turns whatever the priorities (`queue_order`).
    priority = models.SmallIntegerField(default=0, help_text="Higher starts first; FIFO within a priority.")
    # What a starting or running run is doing, as its driver last reported it (e.g. warm
    # start, starting inference engines, first step, stepping), and a detail for people.
    phase = models.CharField(max_length=32, blank=True)
    phase_detail = models.CharField(max_length=PHASE_DETAIL_MAX, blank=True)
    # Where the run's actors run, as its driver reported once they were up: one entry per
    # actor (role, Ray node id and address, node labels, GPU ids, CUDA_VISIBLE_DEVICES, pid).
    placement = models.JSONField(default=list, blank=True)
    # The saved configuration version this run was launched from (None: a built-in
    # preset). RESTRICT, not SET_NULL: a version a run ran cannot be deleted on its own,
    # so the run never loses the record of what it ran; unlike PROTECT it still lets a
    # team be deleted, whose cascade removes the runs and their configurations together.
    saved_config = models.ForeignKey(
        "configs.SavedConfig", null=True, blank=True, on_delete=models.RESTRICT, related_name="runs"
    )
    # Lineage (runs/lineage.py): a retry, resume or clone is a new run that points at the
    # run it came from; the parent's own history is never touched. A resumed run also
    # names the checkpoint it starts from, and its steps continue that checkpoint's count.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    origin = models.CharField(max_length=8, choices=Origin.choices, blank=True, default=Origin.LAUNCH)
    resume_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="resumed_runs"
    )
    # How many automatic resumes (reconcile, `checkpoint.max_restarts`) the chain of runs
    # ending in this one has used.
    restarts = models.SmallIntegerField(default=0)
    notes = models.TextField(blank=True)
    # A simulated run (runs/simulation.py) ran on workers/simulate's cost models, not on
    # GPUs: its series are the simulator's, under the engine's names, so the run and
    # compare pages chart it as any run. `simulation` keeps the cluster, the workload and
    # the simulator's summary.
    simulated = models.BooleanField(default=False, db_index=True)
    simulation = models.JSONField(default=dict, blank=True)

    objects = RunQuerySet.as_manager()
    # A run's place in the queue, where the code that loaded it knew it (`queue_position`).
    known_queue_position: int | None = None
    # The clear ingest token, on the instance that issued it only.
    _ingest_token: str | None = None

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def save(self, *args, **kwargs) -> None:
        # A new run gets a token at once, so that what makes a run (a script, a bench, a
        # test) can post as its driver would; the launch issues the driver a fresh one.
        if self._state.adding and not self.ingest_digest:
            self.issue_ingest_token()
        super().save(*args, **kwargs)

    @property
    def team(self) -> Team:
        return self.experiment.team

    @property
    def ingest_token(self) -> str | None:
        """The clear ingest token this instance issued; None on one loaded from the
        database, which keeps only its hash."""
        return self._ingest_token

    @ingest_token.setter
    def ingest_token(self, token: str) -> None:
        self._ingest_token = token
        self.ingest_digest = ingest_digest(token)

    def issue_ingest_token(self) -> str:
        """A new ingest token for this run, in place of any it had (a driver holding the
        old one can no longer post). Stored at once for a stored run."""
        token = secrets.token_urlsafe(32)
        self.ingest_token = token
        if not self._state.adding:
            Run.objects.filter(pk=self.pk).update(ingest_digest=self.ingest_digest)
        return token

    def is_ingest_token(self, token: str) -> bool:
        """Whether `token` is this run's ingest token (in constant time)."""
        return bool(self.ingest_digest) and hmac.compare_digest(ingest_digest(token), self.ingest_digest)

    def ingest_token_expired(self, now=None) -> bool:
        """Whether the run ended more than ROLLWAY_INGEST_TOKEN_GRACE_S ago: its driver's
        last reports arrive within that, and nothing may post as the run after it."""
        if self.status not in self.TERMINAL:
            return False
        ended = self.finished_at or self.status_changed_at
        grace = timedelta(seconds=settings.ROLLWAY_INGEST_TOKEN_GRACE_S)
        return (now or timezone.now()) > ended + grace

    @cached_property
    def run_config(self) -> RunConfig:
        """The stored config as the engine's typed RunConfig: validated once where it came
        in (`configs.policy.check_config`), read back from its JSON once per loaded row."""
        return RunConfig.model_validate(self.config)

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def can_cancel(self) -> bool:
        return self.status in self.ALLOWED_FROM[self.Status.CANCELLING]

    def get_absolute_url(self) -> str:
        return reverse("dashboard:run", args=[self.pk])

    def queue_position(self) -> int | None:
        """1-based place among the runs waiting in the queue, in its queue order
        (runs/queue.py); None for any other run, including one the queue has scheduled and
        a worker is about to start. One query, and none for a run that is not queued or
        whose place its loader already set (`known_queue_position`, e.g. from
        `Run.objects.queue_positions()` for a whole page of runs)."""
        if self.status != self.Status.QUEUED or self.phase == self.QUEUE_SCHEDULED:
            return None
        if self.known_queue_position is not None:
            return self.known_queue_position
        return Run.objects.queue_positions().get(self.pk)

    def waiting_for(self) -> str | None:
        """Why a queued run has not started yet, as the scheduler last saw it, e.g. "2 runs
        are active (ROLLWAY_MAX_RUNNING=2)"; None unless queued. No query, no call to Ray."""
        if self.status != self.Status.QUEUED:
            return None
        if self.phase == self.QUEUE_SCHEDULED:
            return self.QUEUE_SCHEDULED_DETAIL
        return self.phase_detail or self.QUEUE_NOT_SEEN

    def transition(self, status: str, *, error: str = "", only_from: Iterable[str] | None = None) -> bool:
        """Move to `status` if the row (as stored now, not as loaded) is in a state it may
        be entered from, intersected with `only_from` when given. Returns whether this call
        changed the row; either way the instance is refreshed from the database."""
        allowed = self.ALLOWED_FROM[status]
        if only_from is not None:
            allowed = allowed & frozenset(only_from)
        now = timezone.now()
        fields: dict[str, object] = {"status": status, "status_changed_at": now}
        if status == self.Status.STARTING:
            fields["launched_at"] = now
        elif status == self.Status.RUNNING:
            fields["started_at"] = now
        if status in self.TERMINAL:
            fields["finished_at"] = now
        if error:
            fields["error"] = error
        changed = Run.objects.filter(pk=self.pk, status__in=allowed).update(**fields) == 1
        self.refresh_from_db(
            fields=[
                "status",
                "status_changed_at",
                "error",
                "launched_at",
                "started_at",
                "finished_at",
            ]
        )
        return changed

    def summary(self) -> dict:
        """What the runs list and status events show."""
        experiment = self.experiment
        return {
            "id": self.pk,
            "name": self.name,
            "status": self.status,
            "is_terminal": self.is_terminal,
            "preset": self.preset,
            "experiment": {"id": experiment.pk, "name": experiment.name},
            "team": {"id": experiment.team_id, "name": experiment.team.name},
            "error": self.error,
            "error_detail": self.error_detail,
            "failure": self.failure,
            "phase": self.phase,
            "phase_detail": self.phase_detail,
            "priority": self.priority,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "url": self.get_absolute_url(),
            "queue_position": self.queue_position(),
            "waiting_for": self.waiting_for(),
            "parent": self.parent_id,
            "origin": self.origin,
            "tags": self.tag_names(),
            "simulated": self.simulated,
        }

    def tag_names(self) -> list[str]:
        # A page of runs prefetches `tags` (runs/listing.py); .all() then costs no query.
        return [tag.name for tag in self.tags.all()]

    def detail(self) -> dict:
        return {
            **self.summary(),
            "overrides": self.overrides,
            "config": self.config,
            "launched_by": self.launched_by.get_username() if self.launched_by else None,
            "launched_at": _iso(self.launched_at),
            "series": self.series_names(),
            "saved_config": (
                {"id": self.saved_config_id, "name": self.saved_config.name, "version": self.saved_config.version}
                if self.saved_config_id
                else None
            ),
            "notes": self.notes,
            "restarts": self.restarts,
            "resume_from": self.resume_from.as_dict() if self.resume_from_id else None,
            "children": [{"id": c.pk, "origin": c.origin, "status": c.status} for c in self.team_children()],
            "checkpoints": [c.as_dict() for c in self.checkpoints.order_by("-step")],
            "placement": self.placement,
            "simulation": self.simulation,
            "trackers": self.trackers,
            "ledger": self.ledger(),
            "schedule": self.schedule_summary(),
            "replay": self.replay_comparison(),
        }

    def schedule_summary(self) -> dict | None:
        """The recorded schedule's size (workers/run/schedule.py), without loading it: its
        batches (one a step) and bytes; None before the driver reported one."""
        return RunSchedule.objects.filter(run=self).values("steps", "bytes").first()

    def replay_comparison(self) -> dict | None:
        """How this replay's trained series (TRAINED: those two runs training the same
        batches from the same weights repeat exactly) compare with its original's, step
        by step: per series, the steps each run has, the steps both have, the largest
        |difference| there and the first step where they differ. None for a run that is
        no replay, or whose original is gone or in another team now. The database pairs
        the points (the unique index on run, series and step), so the page never loads
        either run's series."""
        if self.origin != Run.Origin.REPLAY or self.parent_id is None:
            return None
        parent = self.parent
        if parent is None or parent.experiment.team_id != self.experiment.team_id:
            return None
        same_point = {"series": models.OuterRef("series"), "step": models.OuterRef("step")}
        twin = MetricPoint.objects.filter(run_id=parent.pk, **same_point)
        paired = (
            MetricPoint.objects.filter(run_id=self.pk, series__in=TRAINED)
            .annotate(original=models.Subquery(twin.values("value")[:1]))
            .exclude(original=None)
            .annotate(gap=Abs(models.F("value") - models.F("original")))
            .values("series")
            .annotate(
                compared=models.Count("step"),
                largest=models.Max("gap"),
                first_differs=models.Min("step", filter=models.Q(gap__gt=0)),
            )
        )
        counts = (
            MetricPoint.objects.filter(run_id__in=(self.pk, parent.pk), series__in=TRAINED)
            .values("run_id", "series")
            .annotate(steps=models.Count("step"))
        )
        steps = {(row["run_id"], row["series"]): row["steps"] for row in counts}
        by_series = {row["series"]: row for row in paired}
        rows = []
        for series in TRAINED:
            original, replay = steps.get((parent.pk, series), 0), steps.get((self.pk, series), 0)
            if not original and not replay:
                continue
            pair = by_series.get(series, {})
            rows.append(
                {
                    "series": series,
                    "original_steps": original,
                    "replay_steps": replay,
                    "compared": pair.get("compared", 0),
                    "largest_gap": pair.get("largest"),
                    "first_differs": pair.get("first_differs"),
                }
            )
        same = bool(rows) and all(
            r["original_steps"] == r["replay_steps"] == r["compared"] and r["first_differs"] is None for r in rows
        )
        return {"original": parent.pk, "series": rows, "bit_for_bit": same}

    def ledger(self) -> dict[str, int]:
        """The prompt ledger's totals the driver reported when the run's loops stopped
        (`ledger/*`, workers/run/ledger.py), by name without the prefix; {} before then,
        or for a run that reported none."""
        points = self.points.filter(series__startswith=LEDGER_PREFIX).order_by("step")
        return {
            series.removeprefix(LEDGER_PREFIX): round(value) for series, value in points.values_list("series", "value")
        }

    def team_children(self) -> models.QuerySet[Run]:
        """The runs made from this one in its own team, oldest first: a clone into another
        team is that team's run, and this run's readers may not be its readers."""
        return self.children.filter(experiment__team_id=self.experiment.team_id).order_by("pk")

    def series_names(self) -> list[str]:
        # From the widest rollup level (a row or two per series), not a DISTINCT over
        # every point, which grows with the run.
        return sorted(name for _, name in rollups.totals([self.pk]))


class RunTag(models.Model):
    """A label on a run ("baseline", "paper-fig-3"): runs are filtered by them."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=40)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="unique_tag_per_run")]

    def __str__(self) -> str:
        return self.name


class RunSchedule(models.Model):
    """The schedule a run recorded (workers/run/schedule.py): each generate call's worker,
    starting version and groups, each batch's version and group ids in the order they
    were trained, each weight load inside a call and each call's requeued take; what a
    replay of the run follows. Its own table, not a column of Run:
    it grows with the run (hundreds of bytes a step), and every listing reads Run rows."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="schedule")
    admissions = models.JSONField(default=list)  # [[worker, version, groups], ...]
    batches = models.JSONField(default=list)  # [[version, [group id, ...]], ...]
    loads = models.JSONField(default=list)  # [[worker, call, decode step, version], ...]
    requeues = models.JSONField(default=list)  # [[worker, call, [group id, ...]], ...]
    bytes = models.BigIntegerField()  # its size as compact JSON
    steps = models.IntegerField()  # its batches: read without loading them
    recorded_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"run {self.run_id}: {len(self.batches)} batches"

    def as_json(self) -> dict:
        """The schedule as the engine takes it (workers.run.schedule.Schedule.from_json)."""
        return {"admissions": self.admissions, "batches": self.batches, "loads": self.loads, "requeues": self.requeues}


class Checkpoint(models.Model):
    """A checkpoint the run's trainer wrote (workers/run/checkpoints.py): where, how big, its
    digest. The engine prunes old ones (`checkpoint.keep_last`) and says so; the row of a
    pruned checkpoint is deleted with it. `location` (a path or URL under the site's
    checkpoint root) stays on the server: people see `name`, the step directory."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    location = models.CharField(max_length=1000)
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "-step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="unique_checkpoint_per_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"

    @property
    def name(self) -> str:
        """The checkpoint's directory inside its run's ("step-00000040/"), as the engine
        names it: what a reader is told in place of the server's path."""
        leaf = self.location.rstrip("/").rsplit("/", 1)[-1]
        return f"{leaf}/" if STEP_DIR_NAME.fullmatch(leaf) else f"step-{self.step:08d}/"

    def as_dict(self) -> dict:
        return {
            "id": self.pk,
            "run": self.run_id,
            "step": self.step,
            "location": self.name,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "created_at": _iso(self.created_at),
        }


def _iso(value) -> str | None:
    return value.isoformat() if value else None


class MetricPointQuerySet(models.QuerySet):
    def upsert(self, run_id: int, points: Iterable[tuple[str, int, float, float]]) -> int:
        """Insert (series, step, value, time) points for a run in bulk; a point already
        stored for (run, series, step) is overwritten, never duplicated; the run's
        rollups (runs/rollups.py) follow in the same transaction. Returns how many
        distinct points were written."""
        # One statement may not touch a row twice (PostgreSQL's ON CONFLICT rule): the
        # last point for a key in the batch wins, as it would across two batches.
        latest = {(series, step): (value, t) for series, step, value, t in points}
        if not latest:
            return 0
        upsert = {
            "postgresql": self._upsert_postgresql,
            "sqlite": self._upsert_sqlite,
        }.get(connections[self.db].vendor, self._upsert_orm)
        # No savepoint when the caller holds a transaction (the ingest does): a round
        # trip saved, and a failure here fails the caller's write whole anyway.
        with transaction.atomic(using=self.db, savepoint=False):
            upsert(run_id, latest)
            rollups.refresh(run_id, latest.keys(), using=self.db)
        return len(latest)

    # Hand-written SQL because the ORM's bulk_create builds a model instance and SQL per
    # point (and SQLite caps a statement at 999 parameters), too slow for an ingest that
    # must take 10k+ points/s on two cores (docs/performance.md). Same semantics as
    # `_upsert_orm`.
    _COLUMNS = '(run_id, series, step, value, "time")'
    _CONFLICT = 'ON CONFLICT (run_id, series, step) DO UPDATE SET value = EXCLUDED.value, "time" = EXCLUDED."time"'

    def _upsert_orm(self, run_id: int, latest: dict) -> None:
        """Portable but far slower: for databases without a hand-written path."""
        self.bulk_create(
            [
                MetricPoint(run_id=run_id, series=series, step=step, value=value, time=t)
                for (series, step), (value, t) in latest.items()
            ],
            batch_size=5000,
            update_conflicts=True,
            unique_fields=["run", "series", "step"],
            update_fields=["value", "time"],
        )

    def _upsert_postgresql(self, run_id: int, latest: dict) -> None:
        # One statement whatever the batch size: five arrays, unnested server-side.
        series, steps = zip(*latest, strict=True)
        values, times = zip(*latest.values(), strict=True)
        sql = (
            f"INSERT INTO {MetricPoint._meta.db_table} {self._COLUMNS} "
            "SELECT %b, * FROM unnest(%b::text[], %b::bigint[], %b::float8[], %b::float8[]) " + self._CONFLICT
        )
        # Bound in binary: quoting thousands of numbers into SQL text cost more CPU
        # than the rest of the statement (runs/pgbulk.py).
        with pgbulk.binary_cursor(connections[self.db]) as cursor:
            cursor.execute(sql, [run_id, list(series), list(steps), list(values), list(times)])

    def _upsert_sqlite(self, run_id: int, latest: dict) -> None:
        # executemany of one prepared statement runs in C: no per-point round trip.
        sql = f"INSERT INTO {MetricPoint._meta.db_table} {self._COLUMNS} VALUES (%s, %s, %s, %s, %s) " + self._CONFLICT
        rows = [(run_id, s, step, v, t) for (s, step), (v, t) in latest.items()]
        with connections[self.db].cursor() as cursor:
            cursor.executemany(sql, rows)


class MetricPoint(models.Model):
    """One value of one series at one trainer step (see workers/core/metric_names.py)."""

    # The unique constraint's index leads with run, so no separate FK index is needed.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="points", db_index=False)
    series = models.CharField(max_length=64)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.FloatField(help_text="Unix seconds when the engine measured it.")

    objects = MetricPointQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "series", "step"], name="unique_point_per_run_series_step")
        ]

    def __str__(self) -> str:
        return f"{self.series}@{self.step}={self.value}"


class SeriesBucket(models.Model):
    """Aggregates of one series' points with steps in [idx × width, (idx + 1) × width),
    kept up to date as points are written (runs/rollups.py explains the levels): what
    summaries and downsampled charts read instead of every point."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="buckets", db_index=False)
    series = models.CharField(max_length=64)
    width = models.IntegerField()
    idx = models.BigIntegerField()
    n = models.IntegerField(help_text="How many points.")
    total = models.FloatField(help_text="Sum of their values.")
    first_step = models.BigIntegerField()
    # The first lowest and first highest point (ties go to the lower step).
    lo = models.FloatField()
    lo_step = models.BigIntegerField()
    lo_time = models.FloatField()
    hi = models.FloatField()
    hi_step = models.BigIntegerField()
    hi_time = models.FloatField()
    min_time = models.FloatField(help_text="The earliest time of its points.")
    last_step = models.BigIntegerField()
    last_value = models.FloatField()
    last_time = models.FloatField()
    best_moving = models.FloatField(
        null=True, help_text="Highest trailing mean ending at one of its points (full windows; some series only)."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "series", "width", "idx"], name="unique_bucket_per_run_series")
        ]

    def __str__(self) -> str:
        return f"{self.series}[{self.idx * self.width}:{(self.idx + 1) * self.width}] n={self.n}"
