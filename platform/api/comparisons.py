"""The comparisons API: M configurations × N seeds launched as one comparison.

GET  /api/compare                 the comparison of any runs (documented here, served by compare/)
GET  /api/comparisons             the comparisons of the user's teams, newest first
POST /api/comparisons             create one and queue its runs (optional "priority")
GET  /api/comparisons/<id>        its configurations, seeds, runs and compare page link
POST /api/comparisons/<id>/rerun  queue another set of its runs (optional "seeds", "priority")
GET  /api/comparisons/<id>/league           its league table (optional "target")
POST /api/comparisons/<id>/league/simulate  simulate each configuration at the league's scales
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict

from api.openapi import query_doc, responses
from compare import actions, league
from compare import views as compare_views
from compare.models import Comparison
from foundation.http import float_param

router = Router(tags=["comparisons"])


class ComparisonIn(BaseModel):
    """POST /api/comparisons. The content is checked by the actions layer (its messages
    name the fields)."""

    model_config = ConfigDict(extra="forbid")
    team: int | str | None = None
    experiment: Any = None
    name: Any = ""
    description: Any = ""
    configurations: Any = None
    seeds: Any = None
    overrides: Any = None
    priority: Any = None  # every run of the comparison gets it (the queue's order)


class RerunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seeds: Any = None
    priority: Any = None


class Comparisons(Schema):
    comparisons: list[dict[str, Any]]


COMPARE_DOC = query_doc(
    ("runs", "string", "the run ids, comma-separated (required; runs of your teams)"),
    ("target", "number", f"the reward the time-to-target figures aim at (default {compare_views.DEFAULT_TARGET})"),
    (
        "budget",
        "number",
        f"the wall-clock seconds of the reward-at-budget figures (default {compare_views.DEFAULT_BUDGET_S})",
    ),
    ("max_points", "integer", "at most this many points per chart series, min-max downsampled (10 to 100000)"),
    ("after_step", "integer", "only chart points after this step (polling)"),
    ("series", "string", "the metrics whose chart series to send, comma-separated (empty: none; absent: all)"),
    ("format", "string", "json (default) or csv"),
    ("what", "string", "all (json's default), summary (csv's default), series or charts; csv takes summary or series"),
)
COMPARE_DOC["parameters"][0]["required"] = True
COMPARE_DOC["responses"] = {200: {"content": {"text/csv": {"schema": {"type": "string"}}}}}
# compare/urls.py routes /api/compare to the Django view, which reads its query itself (as
# the compare page does) and answers CSV too; this operation only gives it its place in
# the OpenAPI document, and api/urls.py leaves its URL out so the one route stays.
COMPARE_URL_NAME = "compare-documented"


@router.get(
    "/compare",
    url_name=COMPARE_URL_NAME,
    tags=["comparisons"],
    response=responses(dict[str, Any], 200, 400, 404),
    openapi_extra=COMPARE_DOC,
)
def compare(request: HttpRequest) -> HttpResponse:
    """Compare runs: their configurations, time-to-target and reward-at-budget figures,
    the summary by configuration and the chart series, as JSON or CSV."""
    return compare_views.api(request)


@router.get("/comparisons", url_name="comparisons", response=responses(Comparisons))
def list_comparisons(request: HttpRequest) -> JsonResponse:
    """The comparisons of your teams, newest first."""
    found = Comparison.objects.visible_to(request.user).select_related("team", "created_by")
    return JsonResponse({"comparisons": [c.as_dict() for c in found]})


@router.post("/comparisons", url_name="comparisons", response=responses(dict[str, Any], 201, 400, 403, 404, 409))
def launch_comparison(request: HttpRequest, data: ComparisonIn | None = None) -> JsonResponse:
    """Create a comparison (configurations × seeds) and queue its runs."""
    launch = actions.check_comparison(request.user, **(data or ComparisonIn()).model_dump())
    comparison = actions.do_launch_comparison(request.user, launch)
    return JsonResponse(comparison.as_dict(with_runs=True), status=201)


@router.get("/comparisons/{int:comparison_id}", url_name="comparison", response=responses(dict[str, Any], 200, 404))
def get_comparison(request: HttpRequest, comparison_id: int) -> JsonResponse:
    """A comparison's configurations, seeds, runs and compare page link."""
    comparison = actions.check_comparison_access(request.user, comparison_id)
    return JsonResponse(comparison.as_dict(with_runs=True))


@router.post(
    "/comparisons/{int:comparison_id}/rerun",
    url_name="comparison-rerun",
    response=responses(dict[str, Any], 201, 400, 403, 404, 409),
)
def rerun_comparison(request: HttpRequest, comparison_id: int, data: RerunIn | None = None) -> JsonResponse:
    """Queue another set of a comparison's runs (other seeds, another priority)."""
    comparison = actions.check_comparison_access(request.user, comparison_id)
    data = data or RerunIn()
    rerun = actions.check_rerun(request.user, comparison, seeds=data.seeds, priority=data.priority)
    runs = actions.do_rerun_comparison(request.user, comparison, rerun)
    comparison.refresh_from_db()
    return JsonResponse({**comparison.as_dict(with_runs=True), "launched": [r.pk for r in runs]}, status=201)


@router.get(
    "/comparisons/{int:comparison_id}/league",
    url_name="comparison-league",
    response=responses(dict[str, Any], 200, 400, 404),
    openapi_extra=query_doc(
        ("target", "number", f"the reward time to target aims at (default {compare_views.DEFAULT_TARGET})")
    ),
)
def get_league(request: HttpRequest, comparison_id: int) -> JsonResponse:
    """The comparison's league table: each configuration one row, its runs' figures here
    and its simulated runs' at 7B and 32B on 64 and 512 GPUs, each cell with the link to
    the runs behind it."""
    comparison = actions.check_comparison_access(request.user, comparison_id)
    return JsonResponse(league.table(comparison, target=float_param(request, "target", compare_views.DEFAULT_TARGET)))


@router.post(
    "/comparisons/{int:comparison_id}/league/simulate",
    url_name="comparison-league-simulate",
    response=responses(dict[str, Any], 201, 403, 404),
)
def simulate_league(request: HttpRequest, comparison_id: int) -> JsonResponse:
    """Simulate every configuration of the comparison at every scale of the league (its
    newest simulation per cell is the one the league shows); `errors` names a cell the
    simulator could not lay out."""
    comparison = actions.check_comparison_access(request.user, comparison_id)
    made, errors = league.simulate_all(request.user, comparison)
    table = league.table(comparison, target=compare_views.DEFAULT_TARGET)
    return JsonResponse({"simulated": [r.pk for r in made], "errors": errors, "league": table}, status=201)
