"""The engine's ingest endpoints: the driver's reporter posts metric batches and status
changes here, authenticated by the run's own bearer token.

One metrics path for local and remote Ray clusters alike; persisted idempotently (one row
per run, series, step) and then fanned out to the run's WebSocket group.
Throughput target ≥ 10k points/s: one validation pass, one bulk upsert, no per-point query.
"""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from foundation.http import errors_response, refusal_response
from runs.models import Run
from runs.reports import (
    CHECKPOINT_IN,
    STATUS_IN,
    PointIn,
    do_record_checkpoint,
    do_record_phase,
    do_record_points,
    do_record_reported_status,
)

logger = logging.getLogger(__name__)

# Bounds one request's memory (~5 MB of JSON); the reporter sends far smaller batches.
MAX_POINTS_PER_REQUEST = 50_000


class MetricsIn(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    points: Annotated[list[PointIn], Field(max_length=MAX_POINTS_PER_REQUEST)]


METRICS_IN = TypeAdapter(MetricsIn)


def _authorized_run(request: HttpRequest, run_id: int, runs=None) -> Run | JsonResponse:
    """The run (from `runs`, default every column with its experiment and team) if the
    bearer token is its own; else the 404/401 response to return."""
    runs = Run.objects.select_related("experiment__team") if runs is None else runs
    run = runs.filter(pk=run_id).first()
    if run is None:
        return errors_response({"run": f"run {run_id} not found"}, status=404)
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), run.ingest_token.encode()):
        response = errors_response(
            {"auth": "send the run's ingest token as 'Authorization: Bearer <token>'"},
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="rollway-ingest"'
        return response
    return run


def ingest_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    """POST /api/runs/<id>/metrics {"points": [{series, step, value, time}, ...]}."""
    # Only what storing points needs: the whole row (its config JSON decoded) and two
    # joined rows cost about a tenth of a request's CPU (1.5 of 17 ms for 150 points).
    run = _authorized_run(request, run_id, Run.objects.only("pk", "ingest_token"))
    if isinstance(run, JsonResponse):
        return run
    try:
        payload = METRICS_IN.validate_json(request.body)
    except ValidationError as exc:
        return refusal_response(exc)
    points = payload["points"]
    if points:
        with transaction.atomic():
            do_record_points(run, points)
    return JsonResponse({"accepted": len(points)})


def ingest_status(request: HttpRequest, run_id: int) -> JsonResponse:
    """POST /api/runs/<id>/status {"status": "running"|"succeeded"|"failed", "error": "",
    "error_detail": "", "phase": "warm_start"|"starting_engines"|"first_step"|"stepping",
    "phase_detail": ""} (runs.reports.StatusIn).

    Answers the run's status after the call: a driver told "cancelling" or "cancelled"
    knows to stop. A status the run may not enter (a late "running" on a finished run)
    is not an error: it is ignored and `changed` is false."""
    run = _authorized_run(request, run_id)
    if isinstance(run, JsonResponse):
        return run
    try:
        payload = STATUS_IN.validate_json(request.body)
    except ValidationError as exc:
        return refusal_response(exc)
    with transaction.atomic():
        changed = do_record_reported_status(
            run, payload["status"], payload.get("error", ""), payload.get("error_detail", "")
        )
        if "phase" in payload:
            changed = do_record_phase(run, payload["phase"], payload.get("phase_detail", "")) or changed
    return JsonResponse({"status": run.status, "changed": changed})


def ingest_checkpoint(request: HttpRequest, run_id: int) -> JsonResponse:
    """POST /api/runs/<id>/checkpoints {"step", "location", "bytes", "sha256", "pruned":
    [locations]} (runs.reports.CheckpointIn): a checkpoint the run's trainer wrote."""
    run = _authorized_run(request, run_id, Run.objects.only("pk", "ingest_token"))
    if isinstance(run, JsonResponse):
        return run
    try:
        payload = CHECKPOINT_IN.validate_json(request.body)
    except ValidationError as exc:
        return refusal_response(exc)
    row = do_record_checkpoint(run, payload)
    return JsonResponse(row.as_dict(), status=201)


@csrf_exempt  # token-authenticated, never a browser form
@require_POST
def status_view(request: HttpRequest, run_id: int) -> JsonResponse:
    return ingest_status(request, run_id)
