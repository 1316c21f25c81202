"""The comparisons API: M configurations × N seeds launched as one comparison.

GET  /api/comparisons             the comparisons of the user's teams, newest first
POST /api/comparisons             create one and queue its runs (optional "priority")
GET  /api/comparisons/<id>        its configurations, seeds, runs and compare page link
POST /api/comparisons/<id>/rerun  queue another set of its runs (optional "seeds", "priority")
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from pydantic import BaseModel, ConfigDict, ValidationError

from api.http import api_login_required, json_object, refusal_response
from compare import actions
from compare.models import Comparison
from runs.errors import ActionError


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


@require_http_methods(["GET", "POST"])
@api_login_required
def comparisons(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        found = Comparison.objects.visible_to(request.user).select_related("team", "created_by")
        return JsonResponse({"comparisons": [c.as_dict() for c in found]})
    try:
        data = ComparisonIn.model_validate(json_object(request))
        launch = actions.check_comparison(request.user, **data.model_dump())
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    comparison = actions.do_launch_comparison(request.user, launch)
    return JsonResponse(comparison.as_dict(with_runs=True), status=201)


@require_GET
@api_login_required
def comparison_detail(request: HttpRequest, comparison_id: int) -> JsonResponse:
    try:
        comparison = actions.check_comparison_access(request.user, comparison_id)
    except ActionError as exc:
        return refusal_response(exc)
    return JsonResponse(comparison.as_dict(with_runs=True))


@require_POST
@api_login_required
def comparison_rerun(request: HttpRequest, comparison_id: int) -> JsonResponse:
    try:
        comparison = actions.check_comparison_access(request.user, comparison_id)
        data = RerunIn.model_validate(json_object(request))
        rerun = actions.check_rerun(request.user, comparison, seeds=data.seeds, priority=data.priority)
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    runs = actions.do_rerun_comparison(request.user, comparison, rerun)
    comparison.refresh_from_db()
    return JsonResponse({**comparison.as_dict(with_runs=True), "launched": [r.pk for r in runs]}, status=201)
