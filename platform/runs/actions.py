"""The actions layer: `check_*` validate input and enforce access, `do_*` change state
and emit events once the transaction commits. Views, the API, Celery tasks and the
ingest endpoint all go through here, so there is one path per change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any, Iterable

from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from runs import events
from runs.models import Experiment, MetricPoint, Run
from teams.models import Team
from workers.config import RunConfig
from workers.presets import PRESETS, UnknownPreset, build

logger = logging.getLogger(__name__)

RUN_NAME_MAX = Run._meta.get_field("name").max_length


class ActionError(Exception):
    """A request the user may fix: `errors` maps a field (dotted for config fields,
    e.g. "buffer.capacity") to a message that says what to change."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class NotFound(Exception):
    """No such object, or the user may not see it (outsiders learn nothing)."""


# --- access -------------------------------------------------------------------------


def check_run_access(user, run_id: int) -> Run:
    """The run, if `user` is a member of its team; NotFound otherwise."""
    run = (
        Run.objects.visible_to(user)
        .select_related("experiment__team", "launched_by")
        .filter(pk=run_id)
        .first()
    )
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def check_experiment_access(user, experiment_id: Any) -> Experiment:
    try:
        experiment_id = int(experiment_id)
    except (TypeError, ValueError):
        raise ActionError({"experiment": f"must be an experiment id (got {experiment_id!r})"})
    experiment = (
        Experiment.objects.filter(team__in=Team.objects.for_user(user), pk=experiment_id)
        .select_related("team")
        .first()
    )
    if experiment is None:
        raise ActionError({"experiment": f"no experiment {experiment_id} in your teams"})
    return experiment


def check_team_access(user, team: Any) -> Team:
    """A team of the user's, by id or slug."""
    teams = Team.objects.for_user(user)
    found = teams.filter(pk=team).first() if str(team).isdigit() else teams.filter(slug=team).first()
    if found is None:
        raise ActionError({"team": f"you are not a member of team {team!r}"})
    return found


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


def config_errors(exc: ValidationError, model: type[BaseModel] = RunConfig) -> dict[str, str]:
    """Pydantic errors as {"buffer.capacity": "Input should be ≥ 1"}: one message per
    field, worded for a person editing the overrides JSON."""
    errors: dict[str, str] = {}
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        field = ".".join(loc) or "config"
        message = err["msg"]
        if err["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif err["type"] == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            message = f"unknown field {loc[-1]!r}"
            if allowed:
                where = ".".join(loc[:-1]) or "the config"
                message += f"; {where} accepts: {', '.join(allowed)}"
        errors.setdefault(field, message)
    return errors


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    """Field names of the section at `path` inside `model` (empty if not a section)."""
    for part in path:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def check_launch(
    user,
    *,
    experiment: Any = None,
    team: Any = None,
    name: str = "",
    preset: str = "",
    overrides: Any = None,
) -> LaunchRequest:
    """Validate a launch; raise ActionError with every field error found, so the form
    shows them all at once. Config validation is the engine's own (`presets.build`)."""
    errors: dict[str, str] = {}
    exp_obj = team_obj = None
    try:
        if experiment not in (None, ""):
            exp_obj = check_experiment_access(user, experiment)
            team_obj = exp_obj.team
        elif team not in (None, ""):
            team_obj = check_team_access(user, team)
        else:
            errors["experiment"] = "choose an experiment (or give a team to use its default one)"
    except ActionError as exc:
        errors.update(exc.errors)

    name = (name or "").strip()
    if len(name) > RUN_NAME_MAX:
        errors["name"] = f"at most {RUN_NAME_MAX} characters (got {len(name)})"

    if overrides in (None, ""):
        overrides = {}
    if not isinstance(overrides, dict):
        errors["overrides"] = 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}'
        overrides = {}

    config = None
    if not preset:
        errors["preset"] = f"choose a preset: {', '.join(sorted(PRESETS))}"
    else:
        try:
            config = build(preset, overrides)
        except UnknownPreset as exc:
            errors["preset"] = str(exc)
        except ValidationError as exc:
            errors.update(config_errors(exc))

    if errors:
        raise ActionError(errors)
    return LaunchRequest(
        experiment=exp_obj,
        team=team_obj,
        name=name or f"{preset} {timezone.now():%Y-%m-%d %H:%M:%S}",
        preset=preset,
        overrides=overrides,
        config=config,
    )


def do_launch_run(user, launch: LaunchRequest) -> Run:
    """Create the queued Run and, once it is committed, enqueue `launch_run`."""
    from runs.tasks import launch_run

    with transaction.atomic():
        experiment = launch.experiment
        if experiment is None:
            experiment, _ = Experiment.objects.get_or_create(
                team=launch.team, name="default", defaults={"created_by": user}
            )
        run = Run.objects.create(
            experiment=experiment,
            name=launch.name,
            preset=launch.preset,
            overrides=launch.overrides,
            config=launch.config.model_dump(mode="json"),
            launched_by=user,
        )
        run = Run.objects.select_related("experiment__team").get(pk=run.pk)

        def enqueue() -> None:
            try:
                result = launch_run.delay(run.pk)
            except Exception:  # noqa: BLE001 - the run is saved; reconcile_runs resends
                logger.exception("run %s: could not enqueue launch_run; reconcile will", run.pk)
                return
            Run.objects.filter(pk=run.pk).update(celery_task_id=result.id or "")

        transaction.on_commit(lambda: events.send_status(run))
        transaction.on_commit(enqueue)
    logger.info("run %s queued by %s (preset %s)", run.pk, user, run.preset)
    return run


# --- status -------------------------------------------------------------------------


def do_set_run_status(
    run: Run, status: str, *, error: str = "", only_from: Iterable[str] | None = None
) -> bool:
    """Move the run to `status` (see `Run.transition`); on a change, tell its watchers
    once the transaction commits. Returns whether the row changed."""
    changed = run.transition(status, error=error, only_from=only_from)
    if changed:
        logger.info("run %s → %s%s", run.pk, status, f" ({error})" if error else "")
        transaction.on_commit(lambda: events.send_status(run))
    return changed


def check_cancel(user, run: Run) -> None:
    if not run.can_cancel:
        raise ActionError({"status": f"run {run.pk} is {run.status}; nothing to cancel"})


def do_cancel_run(user, run: Run) -> bool:
    """Mark the run cancelling and enqueue `cancel_run`, which stops its Ray actors."""
    changed = do_set_run_status(run, Run.Status.CANCELLING)
    if changed:
        logger.info("run %s cancel requested by %s", run.pk, user)
        transaction.on_commit(lambda: _enqueue_cancel(run.pk))
    return changed


def _enqueue_cancel(run_id: int) -> None:
    from runs.tasks import cancel_run

    try:
        cancel_run.delay(run_id)
    except Exception:  # noqa: BLE001 - the run stays cancelling; reconcile_runs resends
        logger.exception("run %s: could not enqueue cancel_run; reconcile will", run_id)


# --- metrics ------------------------------------------------------------------------


SERIES_PATTERN = r"^[a-z0-9_./-]{1,64}$"
# The error a failed run gets when its driver reported none.
NO_REASON = "failed (the driver gave no reason)"


class PointIn(TypedDict):
    """One metric point as the engine sends it (the ingest and reconcile's spool
    recovery validate against this). TypedDicts validate straight into dicts: no model
    object per point."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    series: Annotated[str, StringConstraints(pattern=SERIES_PATTERN)]
    step: Annotated[int, Field(ge=0)]
    value: Annotated[float, Field(allow_inf_nan=False)]
    time: Annotated[float, Field(allow_inf_nan=False)]


POINT_IN = TypeAdapter(PointIn)


def valid_points(points: Iterable[Any]) -> list[dict]:
    """The points that are valid `PointIn`s (for input read from disk, point by point:
    one bad line does not cost the others)."""
    out = []
    for p in points:
        try:
            out.append(POINT_IN.validate_python(p))
        except ValidationError:
            logger.warning("dropping an invalid metric point: %r", p)
    return out


def do_record_points(run: Run, points: list[dict]) -> int:
    """Store points idempotently (one row per run, series, step) and stream them to the
    run's page. `points` are {"series", "step", "value", "time"} dicts, already valid."""
    written = MetricPoint.objects.upsert(
        run.pk, ((p["series"], p["step"], p["value"], p["time"]) for p in points)
    )
    transaction.on_commit(lambda: events.send_points(run.pk, points))
    return written


# --- workspace ----------------------------------------------------------------------


def do_ensure_demo(user, team_name: str = "Demo", experiment_name: str = "Walking skeleton"):
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
