"""The JSON API: everything the UI does, for scripts and the browser alike.

Session-authenticated (CSRF applies to POSTs as for any session form). The engine's
token-authenticated ingest endpoints live in api/ingest.py.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from pydantic import BaseModel, ConfigDict, ValidationError

from api.http import (
    BadParam,
    api_login_required,
    int_param,
    json_object,
    refusal_response,
)
from api.ingest import ingest_metrics, ingest_status
from runs import actions, exports, listing
from runs.errors import ActionError, NotFound
from runs.metrics import read_series
from runs.models import Experiment
from runs.reports import SERIES_PATTERN
from teams import roles
from teams.models import Team
from workers.config import json_schema
from workers.presets import PRESETS


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for `manage.py up` and load balancers: the site answers and the DB too."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


@require_GET
@api_login_required
def presets(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {
            "presets": [
                {
                    "name": name,
                    "description": preset["description"],
                    "config": preset["config"].model_dump(mode="json"),
                }
                for name, preset in PRESETS.items()
            ]
        }
    )


@require_GET
@api_login_required
def config_schema(request: HttpRequest) -> JsonResponse:
    return JsonResponse(json_schema())


@require_GET
@api_login_required
def teams(request: HttpRequest) -> JsonResponse:
    out = []
    for team in Team.objects.for_user(request.user).prefetch_related("experiments"):
        out.append(
            {
                "id": team.pk,
                "slug": team.slug,
                "name": team.name,
                "role": roles.role_of(request.user, team),
                "experiments": [_experiment(e) for e in team.experiments.all()],
            }
        )
    return JsonResponse({"teams": out})


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


@require_http_methods(["GET", "POST"])
@api_login_required
def experiments(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        found = Experiment.objects.filter(team__in=Team.objects.for_user(request.user))
        return JsonResponse({"experiments": [_experiment(e) for e in found]})
    try:
        data = ExperimentIn.model_validate(json_object(request))
        team = actions.check_team_access(request.user, data.team)
        name = actions.check_experiment_name(data.name)
        experiment = actions.do_create_experiment(request.user, team, name, data.description)
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
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


@require_http_methods(["GET", "POST"])
@api_login_required
def runs(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        # Filters, search, sort and pages as in runs/listing.py (the page reads the same).
        try:
            query = listing.check_list_query(request.GET)
        except ActionError as exc:
            return refusal_response(exc)
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

    try:
        data = LaunchIn.model_validate(json_object(request))
        launch = actions.check_launch(request.user, **data.model_dump())
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    run = actions.do_launch_run(request.user, launch)
    return JsonResponse(run.detail(), status=201)


def _page_url(request: HttpRequest, query: listing.ListQuery, page: int) -> str:
    return f"{request.path}?{urlencode(query.params(page=page))}"


class CancelManyIn(BaseModel):
    """POST /api/runs/cancel. `runs` is checked by the actions layer."""

    model_config = ConfigDict(extra="forbid")
    runs: Any = None


@require_POST
@api_login_required
def runs_cancel(request: HttpRequest) -> JsonResponse:
    """Cancel several runs: {"runs": [ids]} → {"cancelled": [ids], "refused": {id: why}}.
    Each run is checked and cancelled on its own; 200 even when some were refused."""
    try:
        data = CancelManyIn.model_validate(json_object(request))
        run_ids = actions.check_run_ids(data.runs)
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    cancelled, refused = actions.do_cancel_runs(request.user, run_ids)
    return JsonResponse({"cancelled": cancelled, "refused": {str(k): v for k, v in refused.items()}})


@require_GET
@api_login_required
def run_detail(request: HttpRequest, run_id: int) -> JsonResponse:
    try:
        run = actions.check_run_access(request.user, run_id)
    except NotFound as exc:
        return refusal_response(exc)
    return JsonResponse(run.detail())


@require_POST
@api_login_required
def run_cancel(request: HttpRequest, run_id: int) -> JsonResponse:
    try:
        run = actions.check_cancel(request.user, run_id)
    except ActionError as exc:
        return refusal_response(exc)
    actions.do_cancel_run(request.user, run)
    return JsonResponse(run.detail(), status=202)


@csrf_exempt  # POST is the engine's token-authenticated ingest; GET is a session read
@require_http_methods(["GET", "POST"])
def run_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    if request.method == "POST":
        return ingest_metrics(request, run_id)
    return _read_metrics(request, run_id)


@api_login_required
def _read_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    """GET ?series=a,b (or repeated) &after_step=N &max_points=N → each series' points,
    min-max downsampled to at most max_points."""
    try:
        run = actions.check_run_access(request.user, run_id)
    except NotFound as exc:
        return refusal_response(exc)
    try:
        after_step = int_param(request, "after_step", None)
        max_points = int_param(request, "max_points", settings.ROLLWAY_MAX_POINTS_PER_SERIES, lo=10, hi=100_000)
        names = [s for value in request.GET.getlist("series") for s in value.split(",") if s]
        # Only a name the ingest could have stored (a NUL would fail the query itself).
        bad = next((name for name in names if not re.fullmatch(SERIES_PATTERN, name)), None)
        if bad is not None:
            raise BadParam("series", f"series are names such as reward/mean ({SERIES_PATTERN}); got {bad!r}")
    except BadParam as exc:
        return refusal_response(exc)
    return JsonResponse(
        {
            "run": run.pk,
            "status": run.status,
            "max_points": max_points,
            "series": read_series(run, names or None, after_step, max_points),
        }
    )


@csrf_exempt  # token-authenticated, never a browser form
@require_POST
def run_status(request: HttpRequest, run_id: int) -> JsonResponse:
    return ingest_status(request, run_id)


@require_GET
@api_login_required
def run_export(request: HttpRequest, run_id: int):
    """The run's exported model as a zip (runs/exports.py): 404 if there is none or the
    run is not yours, 409 while the run is not finished."""
    try:
        run, directory = exports.check_export(request.user, run_id)
    except ActionError as exc:
        return refusal_response(exc)
    exports.do_record_export(request.user, run)
    return exports.zip_response(request, run, directory)
