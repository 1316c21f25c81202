"""The actions layer: `check_*` validate input and enforce access, `do_*` change state
and emit events once the transaction commits. Views, the API, Celery tasks and the
ingest endpoint all go through here, so there is one path per change.

This module holds what a user asks for (experiments, launch, cancel) and the one status
change every writer uses (`do_set_run_status`). What the engine reports is in
runs/reports.py; a run's life in Ray is in runs/in_ray.py and runs/reconcile.py.
Refusals are the exceptions of foundation/errors.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from configs.actions import check_saved_config_access
from configs.models import SavedConfig
from configs.policy import check_config
from foundation.errors import ActionError, Conflict, NotFound, collected
from foundation.fields import max_length
from foundation.ids import ID_TEXT
from runs import dispatch, events, sinks, tracking
from runs.models import Experiment, Run
from teams import audit, quotas, roles
from teams.models import Team
from teams.roles import check_team_access
from workers.config.presets import PRESETS, deep_merge
from workers.config.run_config import RunConfig
from workers.run import placement

logger = logging.getLogger(__name__)

RUN_NAME_MAX = max_length(Run, "name")
EXPERIMENT_NAME_MAX = max_length(Experiment, "name")
PRIORITY_MIN, PRIORITY_MAX = quotas.PRIORITY_MIN, quotas.PRIORITY_MAX


# --- access: a run or experiment by id, as its team's rule allows (teams/models.py) ---


def check_run_access(user, run_id: int) -> Run:
    """The run, if `user` is a member of its team; NotFound otherwise."""
    run = Run.objects.visible_to(user).select_related("experiment__team", "launched_by").filter(pk=run_id).first()
    if run is None:
        raise NotFound({"run": f"run {run_id} not found"})
    return run


def check_experiment_access(user, experiment_id: Any) -> Experiment:
    try:
        experiment_id = int(experiment_id)
    except (TypeError, ValueError):
        raise ActionError({"experiment": f"must be an experiment id (got {experiment_id!r})"}) from None
    experiment = Experiment.objects.visible_to(user).filter(pk=experiment_id).select_related("team").first()
    if experiment is None:
        raise ActionError({"experiment": f"no experiment {experiment_id} in your teams"})
    return experiment


# --- experiments --------------------------------------------------------------------


def check_experiment_name(name: str) -> str:
    """The name, stripped; ActionError on "name" if it is empty or too long."""
    name = (name or "").strip()
    if not name or len(name) > EXPERIMENT_NAME_MAX:
        raise ActionError({"name": f"must be 1 to {EXPERIMENT_NAME_MAX} characters"})
    return name


def do_create_experiment(user, team: Team, name: str, description: str = "") -> Experiment:
    """A new experiment in `team` (a team of the user's: `check_team_access`) named `name`
    (`check_experiment_name`). A name the team already uses is an ActionError on "name";
    the database's unique constraint decides, so two concurrent requests cannot both
    create it."""
    roles.require(user, team, "create experiments")
    try:
        with transaction.atomic():
            experiment = Experiment.objects.create(team=team, name=name, description=description, created_by=user)
    except IntegrityError:
        raise ActionError({"name": f"team {team.slug} already has an experiment {name!r}"}) from None
    logger.info("experiment %s (%s) created by %s in team %s", experiment.pk, name, user, team.slug)
    return experiment


# --- launching ----------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchRequest:
    """A validated launch: everything `do_launch_run` needs."""

    experiment: Experiment | None  # None: the team's "default" experiment, made on launch
    team: Team
    name: str
    preset: str
    overrides: dict
    config: RunConfig
    saved_config: SavedConfig | None = None
    priority: int = 0
    trackers: list[str] | None = None  # None: every tracker the site has (check_trackers)


def check_priority(value: Any, *, field: str = "priority", role: str | None = None, team: Team | None = None) -> int:
    """A run's queue priority: an integer from PRIORITY_MIN to PRIORITY_MAX, 0 when not
    given. A form sends it as text ("-3"), the API as a JSON number; anything else
    (1.5, "high", true) is an ActionError on `field`. Given the user's `role` in `team`,
    also within what that role may give (`teams.quotas.priority_range`)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,30}", value.strip()):
        value = int(value.strip())
    span = f"from {PRIORITY_MIN} to {PRIORITY_MAX}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError({field: f"must be a whole number {span} (higher starts first), got {value!r}"})
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ActionError({field: f"must be {span} (higher starts first; 0 is the default), got {value}"})
    if team is not None:
        low, high = quotas.priority_range(role)
        if not low <= value <= high:
            raise ActionError(
                {
                    field: f"the {role or 'none'} role in team {team.name} may give a priority from {low} to "
                    f"{high} ({quotas.priority_setting(role)}={high}), got {value}"
                }
            )
    return value


def check_trackers(value: Any, *, field: str = "trackers") -> list[str] | None:
    """The experiment trackers a run is exported to: None (not given) for every one the
    site has, else a list of tracker keys, each one this site has turned on; [] for none.
    The command line sends them as one comma-separated string. Anything else is an ActionError on
    `field` naming the keys and, for a known tracker the site lacks, its setting."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    known, here = sinks.by_key(), {sink.KEY for sink in sinks.configured()}
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise ActionError({field: f"must be a list of tracker names ({', '.join(known)}), got {value!r}"})
    for key in value:
        if key not in known:
            raise ActionError({field: f"{key!r} is not a tracker; the trackers are {', '.join(known)}"})
        if key not in here:
            raise ActionError(
                {field: f"this site does not export to {known[key].NAME}: its operator sets {known[key].SETTING}"}
            )
    return sorted(set(value), key=list(known).index)


def queued_count(team: Team) -> int:
    """The team's runs waiting in the queue (not yet scheduled)."""
    return (
        Run.objects.filter(experiment__team=team, status=Run.Status.QUEUED).exclude(phase=Run.QUEUE_SCHEDULED).count()
    )


def check_team_queue(team: Team, *, adding: int = 1) -> None:
    """Room in the team's queued quota (teams/quotas.py) for `adding` more runs; Conflict
    on "team" naming the quota otherwise."""
    quota = quotas.quota(team, "queued")
    waiting = queued_count(team)
    if quota.allows(waiting + adding):
        return
    fix = "wait for some to start or cancel some"
    if adding == 1:
        raise Conflict({"team": f"team {team.name} already has {waiting} queued runs ({quota.source}): {fix}"})
    raise Conflict(
        {
            "team": f"team {team.name} has {waiting} queued runs and these {adding} would make "
            f"{waiting + adding} ({quota.source}): {fix}, or launch fewer"
        }
    )


def team_gpu_errors(team: Team, config: RunConfig) -> dict[str, str]:
    """{"team": why} if the run asks for more GPUs than its team may ever hold at once
    (it would wait forever); empty otherwise."""
    quota = quotas.quota(team, "gpus")
    gpus = placement.totals(config).gpus
    if quota.allows(gpus):
        return {}
    return {
        "team": f"the run asks for {gpus:g} GPUs and team {team.name} may hold {quota.limit} at once "
        f"({quota.source}): ask for fewer, or set placement.devices to 'cpu'"
    }


def check_queue_entry(user, team: Team, *, priority: Any, config: RunConfig) -> int:
    """What every new queued run of `team` passes however it is made (launch, clone,
    retry, resume, comparison): a priority the user's role may give, room in the team's
    queued quota, and no more GPUs than the team may hold. Returns the priority."""
    priority = check_priority(priority, role=roles.role_of(user, team), team=team)
    check_team_queue(team)
    if errors := team_gpu_errors(team, config):
        raise ActionError(errors)
    return priority


def check_launch(
    user,
    *,
    experiment: Any = None,
    team: Any = None,
    name: str = "",
    preset: str = "",
    overrides: Any = None,
    saved_config: Any = None,
    priority: Any = None,
    trackers: Any = None,
    queued: bool = True,
) -> LaunchRequest:
    """Validate a launch; raise ActionError with every field error found, so the form
    shows them all at once (Forbidden at once if the user's role may not launch there,
    Conflict at once if the team's queued quota is full: `check_team_queue`; not asked
    with `queued=False`, for a run that never waits in the queue, a simulation's).

    `saved_config` (an id) launches a team's saved configuration version instead of a
    built-in `preset`: its base preset and overrides, with `overrides` merged on top.
    The run lands in the configuration's team (its default experiment unless one of
    that team's experiments is given). `priority` orders the run among its team's queued
    runs, within what the user's role may give (`check_priority`). The config is
    validated here, once (`configs.policy`); the LaunchRequest carries it typed from
    here on."""
    errors: dict[str, str] = {}
    saved = _check_saved_config(user, saved_config, preset, errors)
    exp_obj, team_obj = _check_place(user, experiment, team, saved, errors)
    if team_obj is not None and queued:
        check_team_queue(team_obj)  # a full queue: nothing else to fix first
    with collected(errors):
        role = roles.role_of(user, team_obj) if team_obj is not None else None
        priority = check_priority(priority, role=role, team=team_obj)
    with collected(errors):
        trackers = check_trackers(trackers)
    name = (name or "").strip()
    if len(name) > RUN_NAME_MAX:
        errors["name"] = f"at most {RUN_NAME_MAX} characters (got {len(name)})"
    preset, overrides, config = _check_run_config(preset, overrides, saved, saved_config not in (None, ""), errors)
    if queued and team_obj is not None and config is not None:
        for field, message in team_gpu_errors(team_obj, config).items():
            errors.setdefault(field, message)
    if errors:
        raise ActionError(errors)
    assert team_obj is not None and config is not None  # else the errors say why
    return LaunchRequest(
        experiment=exp_obj,
        team=team_obj,
        name=name or f"{saved.label if saved else preset} {timezone.now():%Y-%m-%d %H:%M:%S}",
        preset=preset,
        overrides=overrides,
        config=config,
        saved_config=saved,
        priority=priority,
        trackers=trackers,
    )


def _check_saved_config(user, saved_config: Any, preset: str, errors: dict[str, str]) -> SavedConfig | None:
    """The saved configuration a launch asks for (None: a built-in preset, or refused)."""
    if saved_config in (None, ""):
        return None
    if preset:
        errors["preset"] = "give a preset or a saved_config, not both"
    with collected(errors):
        return check_saved_config_access(user, saved_config)
    return None


def _only_team(user, errors: dict[str, str]) -> Team | None:
    """The team of a launch that names no place: the token's one team, or the person's
    only team. With several (or none) the launch is refused, naming `experiment`."""
    teams = list(Team.objects.for_user(user)[:2])
    if len(teams) == 1:
        return teams[0]
    errors["experiment"] = (
        "choose an experiment (or give a team to use its default one): you belong to several teams"
        if teams
        else "you belong to no team yet: ask a team's admin to add you"
    )
    return None


def _check_place(
    user, experiment: Any, team: Any, saved: SavedConfig | None, errors: dict[str, str]
) -> tuple[Experiment | None, Team | None]:
    """Where the run lands: the experiment given, else the default experiment of the
    team given, of the saved configuration's team, or of the only team the user (or the
    token) has. Launching there needs a role that
    may (Forbidden, raised at once)."""
    exp_obj = team_obj = None
    with collected(errors):
        if experiment not in (None, ""):
            exp_obj = check_experiment_access(user, experiment)
            team_obj = exp_obj.team
        elif team not in (None, ""):
            team_obj = check_team_access(user, team)
        elif saved is not None:
            team_obj = saved.team
        else:
            team_obj = _only_team(user, errors)
    if team_obj is not None:
        roles.require(user, team_obj, "launch runs", field="experiment" if exp_obj else "team")
    if saved is not None and team_obj is not None and team_obj.pk != saved.team_id:
        errors["saved_config"] = (
            f"configuration {saved.label!r} belongs to team {saved.team.name}; "
            f"launch it into one of {saved.team.name}'s experiments"
        )
    return exp_obj, team_obj


def _check_run_config(
    preset: str, overrides: Any, saved: SavedConfig | None, saved_asked: bool, errors: dict[str, str]
) -> tuple[str, dict, RunConfig | None]:
    """(preset, overrides, config) of the run: the preset with the overrides on top, or
    the saved configuration's base preset with its overrides and these on top."""
    if overrides in (None, ""):
        overrides = {}
    if not isinstance(overrides, dict):
        errors["overrides"] = 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}'
        overrides = {}
    if saved is not None:
        # Stored as the base preset + every override, so the run's preset and overrides
        # alone rebuild its config; `saved_config` names the version they came from.
        preset, overrides = saved.base_preset, deep_merge(saved.overrides, overrides)
    if not preset:
        if not saved_asked:  # else: refused above, its config cannot be known
            errors["preset"] = f"choose a preset: {', '.join(sorted(PRESETS))}"
        return preset, overrides, None
    config, config_errors = check_config(preset, overrides)
    errors.update(config_errors)
    return preset, overrides, config


def launch_experiment(user, launch: LaunchRequest) -> Experiment:
    """Where a checked launch lands: its experiment, or its team's "default" one (made
    now, by `user`, when the team has none). Call inside a transaction."""
    if launch.experiment is not None:
        return launch.experiment
    experiment, _ = Experiment.objects.get_or_create(team=launch.team, name="default", defaults={"created_by": user})
    return experiment


def create_run(user, launch: LaunchRequest, **fields: Any) -> Run:
    """The Run row of a checked launch, in the launch's experiment (`launch_experiment`);
    `fields` set the rest (a simulation's). Call inside a transaction."""
    return Run.objects.create(
        experiment=launch_experiment(user, launch),
        name=launch.name,
        preset=launch.preset,
        overrides=launch.overrides,
        config=launch.config.model_dump(mode="json"),
        launched_by=user,
        saved_config=launch.saved_config,
        priority=launch.priority,
        trackers=launch.trackers,
        **fields,
    )


def do_launch_run(user, launch: LaunchRequest, *, schedule: bool = True) -> Run:
    """Create the queued Run and, once it is committed, ask the queue's scheduler
    (runs/queue.py) to look: it sends `launch_run` when the run's turn comes. A caller
    queuing many runs at once passes schedule=False and asks once (`ask_scheduler`)."""
    with transaction.atomic():
        # Two launches at once must not both take the last place in the team's queued
        # quota: the team's row is locked while it is read again (SQLite serializes
        # writers anyway).
        list(Team.objects.select_for_update().filter(pk=launch.team.pk).values_list("pk"))
        check_team_queue(launch.team)
        run = create_run(user, launch)
        run = Run.objects.select_related("experiment__team").get(pk=run.pk)
        audit.record(user, launch.team, audit.Action.LAUNCH, f"run {run.pk}", name=run.name, preset=run.preset)

        transaction.on_commit(lambda: events.send_status(run))
        if schedule:
            ask_scheduler()
    logger.info(
        "run %s queued by %s (preset %s, priority %s)",
        run.pk,
        user,
        run.preset,
        run.priority,
        extra={"run_id": run.pk},
    )
    return run


def ask_scheduler() -> None:
    """Once the current transaction commits, have the queue's scheduler look."""
    transaction.on_commit(lambda: dispatch.send_or_log(dispatch.SCHEDULE_QUEUE))


# --- status -------------------------------------------------------------------------


def do_set_run_status(run: Run, status: str, *, error: str = "", only_from: Iterable[str] | None = None) -> bool:
    """Move the run to `status` (see `Run.transition`); on a change, tell its watchers
    once the transaction commits. A run that ends frees its place in the queue, so the
    queue's scheduler is asked to look. Returns whether the row changed."""
    changed = run.transition(status, error=error, only_from=only_from)
    if changed:
        logger.info("run %s → %s%s", run.pk, status, f" ({error})" if error else "", extra={"run_id": run.pk})
        transaction.on_commit(lambda: events.send_status(run))
        if status in Run.TERMINAL:
            transaction.on_commit(lambda: dispatch.send_or_log(dispatch.SCHEDULE_QUEUE))
            transaction.on_commit(lambda: tracking.ask_export(run.pk, final=True))
    return changed


# --- cancelling ---------------------------------------------------------------------


def check_cancel(user, run_id: int) -> Run:
    """The run, if `user` may cancel it now: NotFound if they may not see it, Forbidden
    if their role does not allow it (a member cancels their own runs, an admin anyone's),
    Conflict (on "status") if it has already ended."""
    run = check_run_access(user, run_id)
    roles.require(user, run.experiment.team, roles.cancel_action(user, run), field="run")
    if not run.can_cancel:
        raise Conflict({"status": f"run {run.pk} is {run.status}; nothing to cancel"})
    return run


def do_cancel_run(user, run: Run) -> bool:
    """Mark the run cancelling and enqueue `cancel_run`, which stops its Ray actors."""
    with transaction.atomic():
        changed = do_set_run_status(run, Run.Status.CANCELLING)
        if changed:
            audit.record(user, run.experiment.team, audit.Action.CANCEL, f"run {run.pk}", name=run.name)
    if changed:
        logger.info("run %s cancel requested by %s", run.pk, user)
        transaction.on_commit(lambda: dispatch.send_or_log(dispatch.CANCEL_RUN, run.pk))
    return changed


BULK_CANCEL_MAX = 200  # one page of the run list


def check_run_ids(value: Any, *, field: str = "runs") -> list[int]:
    """A list of run ids (ints, or digit strings as a form sends them), without repeats;
    ActionError on `field` otherwise."""
    if not isinstance(value, list) or not value:
        raise ActionError({field: "give a non-empty list of run ids, e.g. [12, 15]"})
    if len(value) > BULK_CANCEL_MAX:
        raise ActionError({field: f"at most {BULK_CANCEL_MAX} runs at once (got {len(value)})"})
    ids: list[int] = []
    for item in value:
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and ID_TEXT.fullmatch(item))):
            raise ActionError({field: f"run ids are positive integers (got {item!r})"})
        if int(item) not in ids:
            ids.append(int(item))
    return ids


def do_cancel_runs(user, run_ids: list[int]) -> tuple[list[int], dict[int, str]]:
    """Cancel each run `user` may cancel, each on its own (`check_cancel`, then
    `do_cancel_run`), so one refusal does not stop the others. Returns (the ids now
    cancelling, {id: why it was refused}); a run outside the user's teams is refused as
    not found, like any other request for it."""
    cancelled: list[int] = []
    refused: dict[int, str] = {}
    for run_id in run_ids:
        try:
            run = check_cancel(user, run_id)
        except ActionError as exc:
            refused[run_id] = exc.message
            continue
        with transaction.atomic():
            if do_cancel_run(user, run):
                cancelled.append(run_id)
            else:  # it ended between the check and the update
                refused[run_id] = f"run {run_id} is {run.status}; nothing to cancel"
    return cancelled, refused


# --- workspace ----------------------------------------------------------------------


def do_ensure_demo(user, team_name: str = "Demo", experiment_name: str = "Async vs sync"):
    """The demo team (with `user` as owner) and its first experiment; idempotent.
    Returns (team, experiment). Called by `manage.py up` for the demo user."""
    with transaction.atomic():
        team = Team.objects.ensure_demo(user, name=team_name)
        experiment, _ = Experiment.objects.get_or_create(
            team=team,
            name=experiment_name,
            defaults={
                "created_by": user,
                "description": "Async GRPO on the reverse task: async vs sync presets.",
            },
        )
    return team, experiment
