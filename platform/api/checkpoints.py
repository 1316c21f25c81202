"""A run's checkpoints: the engine posts each one it writes (token-authenticated, as the
other ingest endpoints), and people list them to resume from one."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from api.http import api_login_required, refusal_response
from api.ingest import ingest_checkpoint
from runs import actions
from runs.errors import NotFound


@csrf_exempt  # POST is the engine's token-authenticated ingest; GET is a session read
@require_http_methods(["GET", "POST"])
def run_checkpoints(request: HttpRequest, run_id: int) -> JsonResponse:
    if request.method == "POST":
        return ingest_checkpoint(request, run_id)
    return _list(request, run_id)


@api_login_required
def _list(request: HttpRequest, run_id: int) -> JsonResponse:
    try:
        run = actions.check_run_access(request.user, run_id)
    except NotFound as exc:
        return refusal_response(exc)
    return JsonResponse({"run": run.pk, "checkpoints": [c.as_dict() for c in run.checkpoints.order_by("-step")]})
