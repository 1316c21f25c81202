"""A run's lineage: retry, resume and clone make a new run that points at its parent,
and notes and tags are what people write on a run.

- **Retry** runs the parent's config again, as it was stored, in the same experiment.
- **Resume** continues a run from one of its checkpoints (workers/run/checkpoints.py): the
  child's steps carry on from the checkpoint's step and `stop.max_steps` stays the total,
  so a run resumed at step k of N trains N−k more. The parent's points, status and
  checkpoints are never touched: the child reports under its own id.
- **Replay** runs the parent's config again under the schedule the parent recorded
  (workers/run/schedule.py: which worker generated which groups under which version,
  and which groups each step trained), so an async run's outcome repeats: on the torch
  backend on CPU, its final weights bit for bit. Only a run that succeeded and recorded
  one, of a config a schedule covers.
- **Clone** launches the parent's preset and overrides with the user's edits on top (the
  launch form opens prefilled for it; the API takes the edits in the request), in the
  experiment the user chooses (the parent's by default).

Each is checked against the same roles, config policy and queue as a launch
(runs/actions.py), in the team the child lands in, and written to that team's audit log.
A retry or resume lands in the parent's experiment; a clone is a launch into the chosen
experiment, so it needs the role that launches runs *there*, and it needs only to see the
parent: a viewer may read a run's config anyway, so copying it into a team where they
launch runs gives them nothing they could not type in. The parent's `children` list only
the children in its own team, so a clone into another team is not shown to the parent's.

The reconcile resumes a run whose driver died by the same path (`do_auto_resume`), when
its config allows restarts, as the run's launcher: only while they may still launch runs
in its team.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import transaction

from configs import policy
from foundation.errors import ActionError, Conflict, Forbidden
from runs import actions, events, sinks
from runs.models import Checkpoint, Experiment, Run, RunSchedule, RunTag
from teams import audit, roles
from workers.config.presets import deep_merge
from workers.config.run_config import RunConfig
from workers.rl_tasks import task_class
from workers.rollout.episodes import is_multi_agent
from workers.run.schedule import Schedule, replay_problem, schedule_problem

logger = logging.getLogger(__name__)

Status = Run.Status
Origin = Run.Origin
NOTES_MAX = 20_000
TAGS_MAX = 20
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/-]{0,39}")
# The runs a retry or resume may come from: one still going is cancelled first.
ENDED = (Status.FAILED, Status.CANCELLED, Status.SUCCEEDED)


def _child_name(parent: Run, what: str) -> str:
    return f"{parent.name} ({what})"[: actions.RUN_NAME_MAX]


def _check_launchable(user, parent: Run, config: RunConfig) -> None:
    """The member role in the parent's team, a config the site would launch now (the
    operator's limits and roots may have changed since the parent ran), and the team's
    quotas and the user's priority range (`actions.check_queue_entry`)."""
    roles.require(user, parent.experiment.team, "launch runs", field="run")
    refused = policy.config_errors(config)
    if refused:
        raise ActionError(refused)  # by dotted config field, as a launch's refusal
    actions.check_queue_entry(user, parent.experiment.team, priority=parent.priority, config=config)


def _create_child(user, parent: Run, *, origin: str, name: str, experiment: Experiment | None = None, **fields) -> Run:
    """The child run, in `experiment` (default the parent's), audited in that team."""
    with transaction.atomic():
        run = Run.objects.create(
            experiment=experiment or parent.experiment,
            name=name,
            launched_by=user if getattr(user, "pk", None) else None,
            parent=parent,
            origin=origin,
            **fields,
        )
        run = Run.objects.select_related("experiment__team", "resume_from").get(pk=run.pk)
        action: dict[str, str] = {
            Origin.RETRY: audit.Action.RETRY,
            Origin.RESUME: audit.Action.RESUME,
            Origin.CLONE: audit.Action.CLONE,
            Origin.REPLAY: audit.Action.REPLAY,
        }
        detail = {"child": run.pk}
        if run.resume_from is not None:
            detail["step"] = run.resume_from.step
        audit.record(user, run.experiment.team, action[origin], f"run {parent.pk}", **detail)
        transaction.on_commit(lambda: events.send_status(run))
        actions.ask_scheduler()
    logger.info("run %s: %s of run %s by %s", run.pk, origin, parent.pk, user)
    return run


def _parents_config(parent: Run) -> dict:
    """What a retry, resume or replay takes of its parent as it was stored: its config
    (and where it came from), priority and trackers."""
    return {
        "preset": parent.preset,
        "overrides": parent.overrides,
        "config": parent.config,
        "saved_config": parent.saved_config,
        "priority": parent.priority,
        "trackers": parent.trackers,
    }


# --- retry --------------------------------------------------------------------------


def check_retry(user, run_id: int) -> Run:
    """The run, if `user` may retry it: it has ended, and its config still passes."""
    parent = actions.check_run_access(user, run_id)
    _check_not_simulated(parent, "retry")
    if parent.status not in ENDED:
        raise Conflict({"status": f"run {parent.pk} is {parent.status}; cancel it first or wait for it to end"})
    _check_launchable(user, parent, parent.run_config)
    return parent


def _check_not_simulated(run: Run, action: str) -> None:
    """A simulated run (runs/simulation.py) never ran here: there is nothing to retry or
    resume, and a retry would queue a real run the user did not ask for."""
    if run.simulated:
        raise Conflict(
            {"simulated": f"run {run.pk} was simulated, so there is nothing to {action}: clone it to launch its config"}
        )


def do_retry(user, parent: Run) -> Run:
    """A new queued run with the parent's config, linked to it."""
    return _create_child(
        user,
        parent,
        origin=Origin.RETRY,
        name=_child_name(parent, "retry"),
        **_parents_config(parent),
    )


# --- replay -------------------------------------------------------------------------


def check_replay(user, run_id: int) -> Run:
    """The run, if `user` may replay it: `replay_refusal` has nothing against it, and its
    config still passes."""
    parent = actions.check_run_access(user, run_id)
    refused = replay_refusal(parent)
    if refused:
        raise Conflict(refused)
    _check_launchable(user, parent, parent.run_config)
    return parent


def replay_refusal(run: Run) -> dict[str, str]:
    """Why `run` cannot be replayed, by field ({} when it can): it must have succeeded
    here, recorded a schedule, and have a config a schedule covers; a resumed run's
    checkpoint, where its record starts, must still be kept."""
    if run.simulated:
        return {
            "simulated": f"run {run.pk} was simulated, so there is nothing to replay: clone it to launch its config"
        }
    if run.status != Status.SUCCEEDED:
        return {"status": f"run {run.pk} is {run.status}: only a run that succeeded has a whole schedule to replay"}
    row = RunSchedule.objects.filter(run=run).first()
    if row is None:
        return {"schedule": f"run {run.pk} recorded no schedule (it ran before runs kept theirs)"}
    config = run.run_config
    try:  # the class says whether the task is multi-agent: nothing is built or read
        task = task_class(config.task.name)
    except Exception as exc:  # a task the site no longer finds: the launch check names it too
        return {"task.name": f"run {run.pk} cannot be replayed: {exc}"}
    problem = replay_problem(config, is_multi_agent(task))
    if problem:
        return {"config": f"run {run.pk} cannot be replayed: {problem}"}
    schedule = Schedule.from_json(row.as_json())
    if schedule.starts_at and run.resume_from is None:  # the checkpoint's row went with its pruning
        return {
            "resume_from": f"run {run.pk} resumed from the checkpoint of step {schedule.starts_at}, which the site no "
            "longer keeps, and its replay would resume from it: replay the run it resumed from, or retry this one"
        }
    resume_step = run.resume_from.step if run.resume_from is not None else 0
    problem = schedule_problem(schedule, config, resume_step)
    return {"schedule": f"run {run.pk} cannot be replayed: {problem}"} if problem else {}


def do_replay(user, parent: Run) -> Run:
    """A new queued run with the parent's config that follows the parent's schedule
    (runs/in_ray.py hands it to the driver); a resumed run's replay resumes from the
    checkpoint it resumed from, where its record starts."""
    return _create_child(
        user,
        parent,
        origin=Origin.REPLAY,
        name=_child_name(parent, "replay"),
        **_parents_config(parent),
        resume_from=parent.resume_from,
    )


def replayed_schedule(run: Run) -> dict | None:
    """The schedule a replay follows: its parent's, as the engine takes it. None for any
    other run; LookupError when a replay's parent or its schedule is gone."""
    if run.origin != Origin.REPLAY:
        return None
    row = RunSchedule.objects.filter(run_id=run.parent_id).first() if run.parent_id else None
    if row is None:
        raise LookupError(f"run {run.pk} replays a run whose schedule is gone: launch a retry instead")
    return row.as_json()


# --- resume -------------------------------------------------------------------------


def check_resume(user, run_id: int, step: Any = None) -> tuple[Run, Checkpoint]:
    """The run and the checkpoint to resume it from: the one at `step`, or its latest."""
    parent = actions.check_run_access(user, run_id)
    _check_not_simulated(parent, "resume")
    if parent.status not in ENDED:
        raise Conflict({"status": f"run {parent.pk} is {parent.status}; cancel it first or wait for it to end"})
    checkpoints = parent.checkpoints.all()
    if step not in (None, ""):
        if isinstance(step, bool) or not re.fullmatch(r"[0-9]{1,18}", str(step)):
            raise ActionError({"step": f"must be the step of one of the run's checkpoints (got {step!r})"})
        checkpoint = checkpoints.filter(step=int(step)).first()
        if checkpoint is None:
            steps = ", ".join(str(s) for s in checkpoints.values_list("step", flat=True)) or "none"
            raise ActionError({"step": f"run {parent.pk} has no checkpoint at step {step} (it has: {steps})"})
    else:
        checkpoint = checkpoints.order_by("-step").first()
        if checkpoint is None:
            raise Conflict(
                {"run": f"run {parent.pk} has no checkpoint to resume from (set checkpoint.every_steps to keep some)"}
            )
    config = parent.run_config
    if checkpoint.step >= config.stop.max_steps:
        raise Conflict(
            {"step": f"the checkpoint at step {checkpoint.step} is already at stop.max_steps={config.stop.max_steps}"}
        )
    _check_launchable(user, parent, config)
    return parent, checkpoint


def do_resume(user, parent: Run, checkpoint: Checkpoint, *, restarts: int | None = None) -> Run:
    """A new queued run that continues `parent` from `checkpoint`."""
    return _create_child(
        user,
        parent,
        origin=Origin.RESUME,
        name=_child_name(parent, f"resumed at step {checkpoint.step}"),
        **_parents_config(parent),
        resume_from=checkpoint,
        restarts=parent.restarts if restarts is None else restarts,
    )


def max_restarts(run: Run) -> int:
    """The run's `checkpoint.max_restarts` (a section with defaults: a config stored
    before it existed has none, so 0)."""
    return (run.config.get("checkpoint") or {}).get("max_restarts", 0)


def auto_resume_checkpoint(run: Run) -> Checkpoint | None:
    """The checkpoint the reconcile may resume a dead run from: its latest, when its
    config's `checkpoint.max_restarts` has restarts left; None otherwise."""
    if run.restarts >= max_restarts(run):
        return None
    return run.checkpoints.order_by("-step").first()


def auto_resume_refusal(run: Run) -> str:
    """Why the reconcile may not resume `run` ("" when it may): the child is launched as
    the run's launcher, so they must still be an active user whose role in the run's team
    launches runs. A person reads it on the run, after the run's own failure."""
    team = run.experiment.team
    launcher = run.launched_by
    if launcher is None:
        return (
            f"not resumed: the user who launched it was deleted, and a resume in team {team.slug} runs as its launcher"
        )
    if not launcher.is_active:
        now = "their account is deactivated"
    elif roles.allows(role := roles.role_of(launcher, team), "launch runs"):
        return ""
    else:
        now = f"their role there is {role}" if role else "they are no longer a member"
    return f"not resumed: {launcher.get_username()} may no longer launch runs in team {team.slug} ({now})"


def do_auto_resume(run: Run, checkpoint: Checkpoint) -> Run:
    """The reconcile's resume of a run whose driver died: a child run, counted against the
    chain's `max_restarts`, launched as the run's own launcher would. Forbidden (on "run",
    saying why) when they may no longer launch runs in its team: nothing is created."""
    refused = auto_resume_refusal(run)
    if refused:
        raise Forbidden({"run": refused})
    return do_resume(run.launched_by, run, checkpoint, restarts=run.restarts + 1)


# --- clone --------------------------------------------------------------------------


def check_clone(
    user, run_id: int, *, experiment: Any = None, overrides: Any = None, name: str = "", priority: Any = None
) -> tuple[Run, actions.LaunchRequest]:
    """A launch of the run's preset and overrides with `overrides` merged on top, into
    `experiment` (an experiment id; default the run's own): `check_clone_launch` decides."""
    parent = actions.check_run_access(user, run_id)
    if overrides in (None, ""):
        overrides = {}
    if not isinstance(overrides, dict):
        raise ActionError({"overrides": 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}'})
    launch = check_clone_launch(
        user,
        parent,
        experiment=experiment,
        name=name or _child_name(parent, "clone"),
        preset=parent.preset,
        overrides=deep_merge(parent.overrides, overrides),
        priority=parent.priority if priority is None else priority,
        # The parent's choice, less any tracker the site has turned off since.
        trackers=None if parent.trackers is None else [s.KEY for s in sinks.for_run(parent.trackers)],
    )
    return parent, launch


def check_clone_launch(user, parent: Run, **launch: Any) -> actions.LaunchRequest:
    """A launch of a clone of `parent`, which the user must be able to see (NotFound
    naming nothing of it otherwise), checked as any launch (`actions.check_launch`, whose
    keyword arguments `launch` are) in the experiment or team it names, the parent's
    experiment when it names neither: the role it needs is the one in the team the child
    lands in, whatever the user's role in the parent's."""
    parent = actions.check_run_access(user, parent.pk)  # however the caller found it
    if launch.get("experiment") in (None, "") and launch.get("team") in (None, ""):
        launch["experiment"] = parent.experiment_id
    return actions.check_launch(user, **launch)


def do_clone(user, parent: Run, launch: actions.LaunchRequest) -> Run:
    """The checked launch (`check_clone_launch`) as a child of `parent`, in the launch's
    experiment (its team's "default" one when it named a team) and audited there."""
    with transaction.atomic():
        return _create_child(
            user,
            parent,
            origin=Origin.CLONE,
            experiment=actions.launch_experiment(user, launch),
            name=launch.name,
            preset=launch.preset,
            overrides=launch.overrides,
            config=launch.config.model_dump(mode="json"),
            saved_config=launch.saved_config,
            priority=launch.priority,
            trackers=launch.trackers,
        )


# --- notes and tags -----------------------------------------------------------------


def check_annotate(user, run_id: int, *, notes: Any = None, tags: Any = None) -> tuple[Run, str | None, list | None]:
    """The run and its new notes and tags (None: unchanged). A member edits the notes of
    runs they launched, an admin anyone's."""
    run = actions.check_run_access(user, run_id)
    roles.require(user, run.experiment.team, roles.annotate_action(user, run), field="run")
    errors: dict[str, str] = {}
    if notes is not None:
        if not isinstance(notes, str):
            errors["notes"] = "must be text"
        elif len(notes) > NOTES_MAX or "\x00" in notes:
            errors["notes"] = f"at most {NOTES_MAX} characters, no NUL"
    if tags is not None:
        if isinstance(tags, str):
            tags = [t for t in re.split(r"[,\s]+", tags) if t]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            errors["tags"] = 'a list of tags, e.g. ["baseline", "lr-sweep"]'
        elif len(tags) > TAGS_MAX:
            errors["tags"] = f"at most {TAGS_MAX} tags (got {len(tags)})"
        elif bad := next((t for t in tags if not TAG.fullmatch(t)), None):
            errors["tags"] = (
                f"{bad!r}: a tag is 1 to 40 letters, digits or . _ : + / - (starting with a letter or digit)"
            )
        else:
            tags = list(dict.fromkeys(tags))
    if errors:
        raise ActionError(errors)
    return run, notes, tags


def do_annotate(user, run: Run, notes: str | None, tags: list[str] | None) -> Run:
    with transaction.atomic():
        if notes is not None:
            Run.objects.filter(pk=run.pk).update(notes=notes)
            run.notes = notes
        if tags is not None:
            run.tags.exclude(name__in=tags).delete()
            have = set(run.tags.values_list("name", flat=True))
            RunTag.objects.bulk_create([RunTag(run=run, name=t) for t in tags if t not in have])
        audit.record(
            user,
            run.experiment.team,
            audit.Action.NOTES,
            f"run {run.pk}",
            **({"tags": tags} if tags is not None else {}),
        )
    return run
