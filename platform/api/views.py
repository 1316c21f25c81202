"""The JSON API's runs, metrics, presets, experiments and teams (api/api.py mounts the
router): everything the UI does, for scripts and the browser alike.

The engine's token-authenticated ingest lives in api/ingest.py; its metrics POST shares
its URL with the metrics read below, so ninja routes both.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict, Field

from api.ingest import ingest_metrics
from api.openapi import Errors, query_doc, responses
from configs import policy
from foundation.http import BadParam, int_param
from runs import actions, exports, listing, logs, simulation
from runs.metrics import read_series
from runs.models import Experiment
from runs.reports import SERIES_PATTERN
from teams import actions as team_actions
from teams import quotas, roles
from teams.models import Team
from workers.config.presets import PRESETS
from workers.config.run_config import json_schema

router = Router()


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for `manage.py up` and load balancers: the site answers and the DB too."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


class Preset(Schema):
    name: str
    description: str
    rewards_where: str = Field(
        description="Where the preset's peer scores rewards (which process, per sample, group or batch) and "
        "the nearest Rollway reward-stage setting (rewards.*)."
    )
    config: dict[str, Any]


class Presets(Schema):
    presets: list[Preset]


@router.get("/presets", url_name="presets", tags=["presets"], response=responses(Presets))
def list_presets(request: HttpRequest) -> JsonResponse:
    """The built-in presets, each with its full run configuration and where its peer scores rewards."""
    return JsonResponse(
        {
            "presets": [
                {
                    "name": name,
                    "description": preset["description"],
                    "rewards_where": preset["rewards_where"],
                    "config": preset["config"].model_dump(mode="json"),
                }
                for name, preset in PRESETS.items()
            ]
        }
    )


@router.get("/config/schema", url_name="config-schema", tags=["configs"], response=responses(dict[str, Any]))
def config_schema(request: HttpRequest) -> JsonResponse:
    """The JSON Schema of a run configuration (what `overrides` may set)."""
    return JsonResponse(json_schema())


class ExperimentOut(Schema):
    id: int
    name: str
    description: str
    team: int


class QuotasOut(Schema):
    """The team's share of the site (null: no cap): runs queued, runs active at once, and
    GPUs its active runs hold together."""

    queued: int | None
    running: int | None
    gpus: int | None


class TeamOut(Schema):
    id: int
    slug: str
    name: str
    role: str | None
    experiments: list[ExperimentOut]
    quotas: QuotasOut
    # The queue priorities your role may give a run of this team: [lowest, highest]; null
    # for a role that may not launch.
    priority_range: tuple[int, int] | None


class Teams(Schema):
    teams: list[TeamOut]


@router.get("/teams", url_name="teams", tags=["teams"], response=responses(Teams))
def list_teams(request: HttpRequest) -> JsonResponse:
    """Your teams, your role in each, their experiments, their quotas and the queue
    priorities your role may give."""
    out = []
    for team in Team.objects.for_user(request.user).prefetch_related("experiments"):
        role = roles.role_of(request.user, team)
        out.append(
            {
                "id": team.pk,
                "slug": team.slug,
                "name": team.name,
                "role": role,
                "experiments": [_experiment(e) for e in team.experiments.all()],
                "quotas": quotas.quotas(team),
                "priority_range": quotas.priority_range(role) if roles.allows(role, "launch runs") else None,
            }
        )
    return JsonResponse({"teams": out})


class TeamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Any = None
    slug: Any = None  # default: the name's slug
    admin: Any = None  # the first admin's username or email; default: the creator


class TeamCreated(Schema):
    id: int
    slug: str
    name: str
    admin: str


@router.post("/teams", url_name="teams", tags=["teams"], response=responses(TeamCreated, 201, 400, 403, 409))
def create_team(request: HttpRequest, data: TeamIn | None = None) -> JsonResponse:
    """Create a team with its first admin (the creator unless `admin` names someone): site
    admins (Django staff or superusers) only."""
    data = data or TeamIn()
    name, slug, admin = team_actions.check_new_team(request.user, data.name, data.slug, data.admin)
    team = team_actions.do_create_team(request.user, name, slug, admin)
    return JsonResponse({"id": team.pk, "slug": team.slug, "name": team.name, "admin": admin.username}, status=201)


def _experiment(experiment: Experiment) -> dict[str, Any]:
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "description": experiment.description,
        "team": experiment.team_id,
    }


class ExperimentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: int | str
    name: str
    description: str = ""


class Experiments(Schema):
    experiments: list[ExperimentOut]


@router.get("/experiments", url_name="experiments", tags=["experiments"], response=responses(Experiments))
def list_experiments(request: HttpRequest) -> JsonResponse:
    """The experiments of your teams."""
    found = Experiment.objects.visible_to(request.user)
    return JsonResponse({"experiments": [_experiment(e) for e in found]})


@router.post(
    "/experiments",
    url_name="experiments",
    tags=["experiments"],
    response=responses(ExperimentOut, 201, 400, 403, 404),
)
def create_experiment(request: HttpRequest, data: ExperimentIn | None = None) -> JsonResponse:
    """Create an experiment in a team (id or slug) where you are a member or admin."""
    data = data or ExperimentIn.model_validate({})
    team = roles.check_team_access(request.user, data.team)
    name = actions.check_experiment_name(data.name)
    experiment = actions.do_create_experiment(request.user, team, name, data.description)
    return JsonResponse(_experiment(experiment), status=201)


class LaunchIn(BaseModel):
    """POST /api/runs. `overrides` is checked by the actions layer (its message is better)."""

    model_config = ConfigDict(extra="forbid")
    experiment: int | None = None
    team: int | str | None = None
    name: str = ""
    preset: str = ""
    overrides: Any = None
    saved_config: int | None = None  # a saved configuration version's id, instead of a preset
    priority: Any = None  # the queue's order, higher first; checked by the actions layer
    trackers: Any = None  # experiment trackers by key (mlflow, tensorboard, wandb); unset: the site's


class RunPage(Schema):
    runs: list[dict[str, Any]]
    total: int
    page: int
    page_size: int
    pages: int
    next: str | None
    prev: str | None


LIST_DOC = query_doc(
    ("status", "string", "comma-separated statuses, e.g. running,queued"),
    ("preset", "string", "the preset's name"),
    ("experiment", "integer", "an experiment's id"),
    ("launcher", "string", "who launched the run (username)"),
    ("created_from", "string", "launched on or after, YYYY-MM-DD"),
    ("created_to", "string", "launched on or before, YYYY-MM-DD"),
    ("q", "string", "search in names"),
    ("sort", "string", "a column, - first to reverse (e.g. -created)"),
    ("page", "integer", "the page, from 1"),
    ("page_size", "integer", "runs per page"),
)


@router.get("/runs", url_name="runs", tags=["runs"], response=responses(RunPage, 200, 400), openapi_extra=LIST_DOC)
def list_runs(request: HttpRequest) -> JsonResponse:
    """Your teams' runs: filters, search, sort and pages as on the runs page (runs/listing.py)."""
    query = listing.check_list_query(request.GET)
    page = listing.list_runs(request.user, query)
    return JsonResponse(
        {
            "runs": [listing.row(run) for run in page.runs],
            "total": page.total,
            "page": query.page,
            "page_size": query.page_size,
            "pages": page.pages,
            "next": _page_url(request, query, query.page + 1) if page.has_next else None,
            "prev": _page_url(request, query, query.page - 1) if page.has_prev else None,
        }
    )


@router.post("/runs", url_name="runs", tags=["runs"], response=responses(dict[str, Any], 201, 400, 403, 404, 409))
def launch_run(request: HttpRequest, data: LaunchIn | None = None) -> JsonResponse:
    """Queue a run: an experiment (or a team, for its default experiment), a preset or a
    saved configuration's version, and `overrides` on top."""
    launch = actions.check_launch(request.user, **(data or LaunchIn()).model_dump())
    run = actions.do_launch_run(request.user, launch)
    # Beside the run: the settings its checkpoint's size would want (none for the tiny model),
    # and those it sets that the run will not read (none for a preset as it is).
    answer = {"fitting": policy.settings_that_fit(launch.config), "unread": policy.unread_settings(launch.config)}
    return JsonResponse({**run.detail(), **answer}, status=201)


class SimulateIn(LaunchIn):
    """POST /api/simulations: a launch's fields plus the simulated `cluster` and
    `workload` (runs/simulation.py) and how many trainer `steps` (the config's
    stop.max_steps unless given)."""

    cluster: Any = None
    workload: Any = None
    steps: Any = None


@router.post(
    "/simulations", url_name="simulations", tags=["runs"], response=responses(dict[str, Any], 201, 400, 403, 404)
)
def simulate_run(request: HttpRequest, data: SimulateIn | None = None) -> JsonResponse:
    """Simulate a run (workers/simulate) instead of queueing it: the same config as a
    launch on a described cluster and workload. Answers the finished run, marked
    `simulated`, its series stored as a run's are."""
    launch, sim = simulation.check_simulated_launch(request.user, **(data or SimulateIn()).model_dump())
    run = simulation.do_simulate_run(request.user, launch, sim)
    return JsonResponse(run.detail(), status=201)


class PlanIn(SimulateIn):
    """POST /api/simulations/plan: a simulation's fields plus `goal_samples` (rank the
    settings by the simulated time to train that many samples; empty: by samples/s)."""

    goal_samples: Any = None


@router.post(
    "/simulations/plan",
    url_name="simulations-plan",
    tags=["runs"],
    response=responses(dict[str, Any], 201, 400, 403, 404),
)
def plan_run(request: HttpRequest, data: PlanIn | None = None) -> JsonResponse:
    """Plan a run on a described cluster: search the inference:trainer split, the
    staleness bound, the buffer depth and the sync protocol in the simulator, and store
    the best setting and the config as given as two simulated runs. Answers the best
    one's run (its `simulation.plan` holds the ranked settings), `baseline` (the as-given
    run) and `ranked` (every setting tried, best first)."""
    launch, sim, goal = simulation.check_plan(request.user, **(data or PlanIn()).model_dump())
    done = simulation.do_plan(request.user, launch, sim, goal)
    return JsonResponse(
        {
            **done.best.detail(),
            "baseline": done.baseline.detail(),
            "ranked": [simulation.candidate_row(c) for c in done.ranked],
        },
        status=201,
    )


@router.post(
    "/runs/{int:run_id}/plan/{int:row}",
    url_name="run-plan-row",
    tags=["runs"],
    response=responses(dict[str, Any], 200, 201, 400, 403, 404),
)
def simulate_plan_row(request: HttpRequest, run_id: int, row: int) -> JsonResponse:
    """Row `row` (1 = the best) of a planned run's table as a simulated run, as the planned
    run was simulated but for the row's settings: 201 with the new run, or 200 with the run
    the row already is (the first row: the planned run itself). The planned run's table
    keeps each simulated row's run id under `run`."""
    done, new = simulation.do_simulate_plan_row(request.user, *simulation.check_plan_row(request.user, run_id, row))
    return JsonResponse(done.detail(), status=201 if new else 200)


def _page_url(request: HttpRequest, query: listing.ListQuery, page: int) -> str:
    return f"{request.path}?{urlencode(query.params(page=page))}"


class CancelManyIn(BaseModel):
    """POST /api/runs/cancel. `runs` is checked by the actions layer."""

    model_config = ConfigDict(extra="forbid")
    runs: Any = None


class Cancelled(Schema):
    cancelled: list[int]
    refused: dict[str, str]


@router.post("/runs/cancel", url_name="runs-cancel", tags=["runs"], response=responses(Cancelled, 200, 400))
def cancel_runs(request: HttpRequest, data: CancelManyIn | None = None) -> JsonResponse:
    """Cancel several runs: {"runs": [ids]} → {"cancelled": [ids], "refused": {id: why}}.
    Each run is checked and cancelled on its own; 200 even when some were refused."""
    run_ids = actions.check_run_ids((data or CancelManyIn()).runs)
    cancelled, refused = actions.do_cancel_runs(request.user, run_ids)
    return JsonResponse({"cancelled": cancelled, "refused": {str(k): v for k, v in refused.items()}})


@router.get("/runs/{int:run_id}", url_name="run", tags=["runs"], response=responses(dict[str, Any], 200, 404))
def get_run(request: HttpRequest, run_id: int) -> JsonResponse:
    """One run: its configuration, status, phase and series names."""
    run = actions.check_run_access(request.user, run_id)
    return JsonResponse(run.detail())


@router.post(
    "/runs/{int:run_id}/cancel",
    url_name="run-cancel",
    tags=["runs"],
    response=responses(dict[str, Any], 202, 403, 404, 409),
)
def cancel_run(request: HttpRequest, run_id: int) -> JsonResponse:
    """Cancel a queued or running run (your own; an admin anyone's): 202, it stops soon."""
    run = actions.check_cancel(request.user, run_id)
    actions.do_cancel_run(request.user, run)
    return JsonResponse(run.detail(), status=202)


# The largest step a range may name (steps are stored as 64-bit integers).
STEP_MAX = 2**62


class Series(Schema):
    run: int
    status: str
    max_points: int
    series: dict[str, Any]


METRICS_DOC = query_doc(
    ("series", "string", "series names, comma-separated or repeated (default: all)"),
    ("after_step", "integer", "only points after this step (polling)"),
    ("from_step", "integer", "only points at or after this step (a zoomed chart; downsampled within the range)"),
    ("to_step", "integer", "only points at or before this step (a zoomed chart; downsampled within the range)"),
    ("max_points", "integer", "at most this many points per series, min-max downsampled (10 to 100000)"),
)


@router.get(
    "/runs/{int:run_id}/metrics",
    url_name="run-metrics",
    tags=["metrics"],
    response=responses(Series, 200, 400, 404),
    openapi_extra=METRICS_DOC,
)
def read_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    """A run's metric series, each min-max downsampled to at most `max_points`."""
    run = actions.check_run_access(request.user, run_id)
    after_step = int_param(request, "after_step", None)
    from_step = int_param(request, "from_step", None, lo=0, hi=STEP_MAX)
    to_step = int_param(request, "to_step", None, lo=0, hi=STEP_MAX)
    if from_step is not None and to_step is not None and to_step < from_step:
        raise BadParam("to_step", f"to_step must be ≥ from_step ({from_step}); got {to_step}")
    max_points = int_param(request, "max_points", settings.ROLLWAY_MAX_POINTS_PER_SERIES, lo=10, hi=100_000)
    names = [s for value in request.GET.getlist("series") for s in value.split(",") if s]
    # Only a name the ingest could have stored (a NUL would fail the query itself).
    bad = next((name for name in names if not re.fullmatch(SERIES_PATTERN, name)), None)
    if bad is not None:
        raise BadParam("series", f"series are names such as reward/mean ({SERIES_PATTERN}); got {bad!r}")
    return JsonResponse(
        {
            "run": run.pk,
            "status": run.status,
            "max_points": max_points,
            "series": read_series(run, names or None, after_step, max_points, from_step=from_step, to_step=to_step),
        }
    )


# The engine's metric batches: the run's own bearer token, not a user (api/ingest.py
# checks it), so no user auth and no CSRF. Left out of the schema: the engine's
# reporter is its one client.
@router.post("/runs/{int:run_id}/metrics", url_name="run-metrics", auth=None, include_in_schema=False)
def run_metrics_ingest(request: HttpRequest, run_id: int) -> JsonResponse:
    return ingest_metrics(request, run_id)


@router.get(
    "/runs/{int:run_id}/export",
    url_name="run-export",
    tags=["exports"],
    response={200: None, 401: Errors, 404: Errors, 409: Errors},
    openapi_extra={"responses": {200: {"description": "the model as a zip", "content": {"application/zip": {}}}}},
)
def download_export(request: HttpRequest, run_id: int):
    """The run's exported model as a zip (runs/exports.py): 404 if there is none or the
    run is not yours, 409 while the run is not finished."""
    run, directory = exports.check_export(request.user, run_id)
    exports.do_record_export(request.user, run)
    return exports.zip_response(request, run, directory)


class RunLog(Schema):
    run: int
    status: str
    size: int
    offset: int
    truncated: bool
    text: str


LOG_DOC = query_doc(("tail_bytes", "integer", f"at most this many bytes of the log's end (1 to {logs.TAIL_BYTES})"))


@router.get(
    "/runs/{int:run_id}/log",
    url_name="run-log",
    tags=["runs"],
    response=responses(RunLog, 200, 400, 404),
    openapi_extra=LOG_DOC,
)
def read_log(request: HttpRequest, run_id: int) -> JsonResponse:
    """The end of the run's driver log (runs/logs.py), cut to whole lines: `size` is the
    whole file's bytes, `offset` where `text` starts in it. 404 with the reason when the
    log is not on this host (yet, or any more)."""
    max_bytes = int_param(request, "tail_bytes", logs.TAIL_BYTES, lo=1, hi=logs.TAIL_BYTES)
    run, path = logs.check_log(request.user, run_id)
    return JsonResponse({"run": run.pk, "status": run.status, **logs.tail(path, max_bytes)})


@router.get(
    "/runs/{int:run_id}/log/download",
    url_name="run-log-download",
    tags=["runs"],
    response={200: None, 401: Errors, 404: Errors},
    openapi_extra={"responses": {200: {"description": "the whole driver log", "content": {"text/plain": {}}}}},
)
def download_log(request: HttpRequest, run_id: int):
    """The run's whole driver log as a text file; 404 with the reason when it is not here."""
    run, path = logs.check_log(request.user, run_id)
    return logs.download_response(request, run, path)
