"""The engine's ingest endpoints: the driver's reporter posts metric batches, status
changes and checkpoints here, authenticated by the run's own bearer token.

Each endpoint is an `Ingest`: the body it takes and how it is stored. `receive` is their
one wiring: the run's token, the body validated once against its TypedDict, then stored
through runs/reports.py. (Their body limit, the ingest's, is applied before any view:
foundation/bodylimits.py, for the paths settings.ROLLWAY_INGEST_PATHS names.) One metrics
path for local and remote Ray clusters alike, persisted idempotently (one row per run,
series, step) and fanned out to the run's WebSocket group: one validation pass, one bulk
upsert, no query per point.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from django.conf import settings
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
    PLACEMENT_IN,
    SCHEDULE_IN,
    STATUS_IN,
    PointIn,
    do_record_checkpoint,
    do_record_phase,
    do_record_placement,
    do_record_points,
    do_record_reported_status,
    do_record_schedule,
)

logger = logging.getLogger(__name__)

SEND_TOKEN = "send the run's ingest token as 'Authorization: Bearer <token>'"
# Bounds one request's memory (~5 MB of JSON); the reporter sends far smaller batches.
MAX_POINTS_PER_REQUEST = 50_000


class MetricsIn(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    points: Annotated[list[PointIn], Field(max_length=MAX_POINTS_PER_REQUEST)]


METRICS_IN = TypeAdapter(MetricsIn)


@dataclass(frozen=True)
class Ingest:
    """One kind of report: the body it takes, what storing it needs of the Run row beyond
    what the token check reads (`columns`; None: the whole row with its experiment and
    team), and `store`, which
    records a valid body and returns the answer (its JSON and status)."""

    body: TypeAdapter
    store: Callable[[Run, Any], tuple[dict, int]]
    columns: tuple[str, ...] | None = None


def receive(ingest: Ingest, request: HttpRequest, run_id: int) -> JsonResponse:
    """The one path of every report: 401 without the run's own valid token (an unknown run
    answers the same, so run ids cannot be probed), 400 by field for a body that is not
    valid, else what `ingest.store` answers."""
    run = _authorized_run(request, run_id, ingest.columns)
    if isinstance(run, JsonResponse):
        return run
    try:
        payload = ingest.body.validate_json(request.body)
    except ValidationError as exc:
        return refusal_response(exc)
    answer, status = ingest.store(run, payload)
    return JsonResponse(answer, status=status)


# What the token check reads of the row, whatever the report needs.
TOKEN_COLUMNS = ("pk", "ingest_digest", "status", "status_changed_at", "finished_at")


def _refused(message: str) -> JsonResponse:
    response = errors_response({"auth": message}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="rollway-ingest"'
    return response


def _authorized_run(request: HttpRequest, run_id: int, columns: tuple[str, ...] | None) -> Run | JsonResponse:
    """The run, if the request's bearer token is its own and still valid; else the 401 to
    answer. A missing token, a wrong one and a run that does not exist get one answer."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _refused(SEND_TOKEN)
    rows = (
        Run.objects.only(*TOKEN_COLUMNS, *columns)
        if columns is not None
        else Run.objects.select_related("experiment__team")
    )
    run = rows.filter(pk=run_id).first()
    if run is None or not run.is_ingest_token(token.strip()):
        return _refused(SEND_TOKEN)
    # Only the holder of the run's own token learns this: the run exists and has ended.
    if run.ingest_token_expired():
        return _refused(
            f"this run ended more than ROLLWAY_INGEST_TOKEN_GRACE_S={settings.ROLLWAY_INGEST_TOKEN_GRACE_S} s "
            "ago: its ingest token has expired"
        )
    return run


def _store_points(run: Run, payload: MetricsIn) -> tuple[dict, int]:
    points = payload["points"]
    if points:
        with transaction.atomic():
            do_record_points(run, points)
    return {"accepted": len(points)}, 200


def _store_status(run: Run, payload: Any) -> tuple[dict, int]:
    with transaction.atomic():
        changed = do_record_reported_status(
            run,
            payload["status"],
            payload.get("error", ""),
            payload.get("error_detail", ""),
            error_kind=payload.get("error_kind", ""),
            failure=payload.get("failure"),
        )
        if "phase" in payload:
            changed = do_record_phase(run, payload["phase"], payload.get("phase_detail", "")) or changed
    return {"status": run.status, "changed": changed}, 200


def _store_checkpoint(run: Run, payload: Any) -> tuple[dict, int]:
    return do_record_checkpoint(run, payload).as_dict(), 201


def _store_placement(run: Run, payload: Any) -> tuple[dict, int]:
    return {"actors": len(payload["actors"]), "changed": do_record_placement(run, payload)}, 200


# POST /api/runs/<id>/metrics {"points": [{series, step, value, time}, ...]}. Only what
# storing points needs of the row: the whole row (its config JSON decoded) and two
# joined rows would cost a noticeable share of each request's CPU.
METRICS = Ingest(METRICS_IN, _store_points, columns=())
# POST /api/runs/<id>/status {"status": "running"|"succeeded"|"failed", "error": "",
# "error_detail": "", "error_kind": "", "failure": {kind, message, actor, actor_name, node,
# operation, error, traceback}, "phase": one of workers.run.reporter.PHASES, "phase_detail": ""}
# (runs.reports.StatusIn). Answers the run's status after the call and whether this
# report changed it, for a script or a person reading it: the reporter reads only the
# HTTP status (a cancel reaches the driver through Ray, runs/in_ray.py). A status the
# run may not enter (a late "running" on a finished run) is not an error: it is ignored
# and `changed` is false.
STATUS = Ingest(STATUS_IN, _store_status)
# POST /api/runs/<id>/checkpoints {"step", "location", "bytes", "sha256", "pruned":
# [locations]} (runs.reports.CheckpointIn): a checkpoint the run's trainer wrote.
CHECKPOINT = Ingest(CHECKPOINT_IN, _store_checkpoint, columns=())


def _store_schedule(run: Run, payload: Any) -> tuple[dict, int]:
    row = do_record_schedule(run, payload)
    return {"batches": len(row.batches), "bytes": row.bytes}, 200


# POST /api/runs/<id>/placement {"actors": [{actor, node_id, node_ip, labels, gpu_ids,
# cuda_visible_devices, pid}, ...]} (runs.reports.PlacementIn): where the run's actors
# run, once they are up.
PLACEMENT = Ingest(PLACEMENT_IN, _store_placement, columns=())
# POST /api/runs/<id>/schedule {"admissions": [[worker, version, groups], ...], "batches":
# [[version, [group id, ...]], ...], "bytes", "bytes_per_step"} (runs.reports.ScheduleIn):
# the schedule the run recorded, which a replay of it follows.
SCHEDULE = Ingest(SCHEDULE_IN, _store_schedule, columns=())


def ingest_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    return receive(METRICS, request, run_id)


def ingest_checkpoint(request: HttpRequest, run_id: int) -> JsonResponse:
    return receive(CHECKPOINT, request, run_id)


@csrf_exempt  # token-authenticated, never a browser form
@require_POST
def status_view(request: HttpRequest, run_id: int) -> JsonResponse:
    return receive(STATUS, request, run_id)


@csrf_exempt  # token-authenticated, never a browser form
@require_POST
def placement_view(request: HttpRequest, run_id: int) -> JsonResponse:
    return receive(PLACEMENT, request, run_id)


@csrf_exempt  # token-authenticated, never a browser form
@require_POST
def schedule_view(request: HttpRequest, run_id: int) -> JsonResponse:
    return receive(SCHEDULE, request, run_id)
