"""The JSON API of a run's lineage (runs/lineage.py): its checkpoints, retry, resume,
clone with edits, and notes and tags. Each answer with a new run is the run's detail,
201, as a launch's is."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict

from api.ingest import ingest_checkpoint
from api.openapi import responses
from runs import actions, lineage

router = Router()


class CheckpointOut(Schema):
    id: int
    run: int
    step: int
    location: str
    bytes: int
    sha256: str
    created_at: str | None


class Checkpoints(Schema):
    run: int
    checkpoints: list[CheckpointOut]


@router.get(
    "/runs/{int:run_id}/checkpoints",
    url_name="run-checkpoints",
    tags=["runs"],
    response=responses(Checkpoints, 200, 404),
)
def list_checkpoints(request: HttpRequest, run_id: int) -> JsonResponse:
    """The run's checkpoints, newest first (the engine prunes to `checkpoint.keep_last`)."""
    run = actions.check_run_access(request.user, run_id)
    return JsonResponse({"run": run.pk, "checkpoints": [c.as_dict() for c in run.checkpoints.order_by("-step")]})


# The engine announces each checkpoint with the run's own bearer token (api/ingest.py
# checks it): no user auth and no CSRF, and out of the schema like the metrics ingest.
@router.post("/runs/{int:run_id}/checkpoints", url_name="run-checkpoints", auth=None, include_in_schema=False)
def checkpoint_ingest(request: HttpRequest, run_id: int) -> JsonResponse:
    return ingest_checkpoint(request, run_id)


@router.post(
    "/runs/{int:run_id}/retry",
    url_name="run-retry",
    tags=["runs"],
    response=responses(dict[str, Any], 201, 400, 403, 404, 409),
)
def retry_run(request: HttpRequest, run_id: int) -> JsonResponse:
    """A new run with this ended run's config, linked to it (`parent`, origin "retry")."""
    parent = lineage.check_retry(request.user, run_id)
    return JsonResponse(lineage.do_retry(request.user, parent).detail(), status=201)


@router.post(
    "/runs/{int:run_id}/replay",
    url_name="run-replay",
    tags=["runs"],
    response=responses(dict[str, Any], 201, 400, 403, 404, 409),
)
def replay_run(request: HttpRequest, run_id: int) -> JsonResponse:
    """A new run with this succeeded run's config that follows the schedule it recorded
    (`parent`, origin "replay"): the same batches in the same order."""
    parent = lineage.check_replay(request.user, run_id)
    return JsonResponse(lineage.do_replay(request.user, parent).detail(), status=201)


class ResumeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int | None = None  # a checkpoint's step; none: the latest


@router.post(
    "/runs/{int:run_id}/resume",
    url_name="run-resume",
    tags=["runs"],
    response=responses(dict[str, Any], 201, 400, 403, 404, 409),
)
def resume_run(request: HttpRequest, run_id: int, data: ResumeIn | None = None) -> JsonResponse:
    """A child run that continues this ended run from its checkpoint at `step` (default
    the latest): steps go on from there to the same stop.max_steps."""
    parent, checkpoint = lineage.check_resume(request.user, run_id, (data or ResumeIn()).step)
    return JsonResponse(lineage.do_resume(request.user, parent, checkpoint).detail(), status=201)


class CloneIn(BaseModel):
    """`overrides` are merged over the run's own; checked as a launch's are, in
    `experiment` (an experiment id of yours; default the run's own), where your role
    must launch runs."""

    model_config = ConfigDict(extra="forbid")
    experiment: int | None = None
    overrides: Any = None
    name: str = ""
    priority: Any = None


@router.post(
    "/runs/{int:run_id}/clone",
    url_name="run-clone",
    tags=["runs"],
    response=responses(dict[str, Any], 201, 400, 403, 404, 409),
)
def clone_run(request: HttpRequest, run_id: int, data: CloneIn | None = None) -> JsonResponse:
    """Launch this run's preset and overrides with your edits on top, in its experiment
    or the one you name (any run you may read may be cloned where you may launch)."""
    data = data or CloneIn()
    parent, launch = lineage.check_clone(
        request.user,
        run_id,
        experiment=data.experiment,
        overrides=data.overrides,
        name=data.name,
        priority=data.priority,
    )
    return JsonResponse(lineage.do_clone(request.user, parent, launch).detail(), status=201)


class NotesIn(BaseModel):
    """Either or both; a field left out stays as it is. `tags` replaces the set."""

    model_config = ConfigDict(extra="forbid")
    notes: str | None = None
    tags: list[str] | None = None


@router.post(
    "/runs/{int:run_id}/notes",
    url_name="run-notes",
    tags=["runs"],
    response=responses(dict[str, Any], 200, 400, 403, 404),
)
def annotate_run(request: HttpRequest, run_id: int, data: NotesIn | None = None) -> JsonResponse:
    """Set the run's notes and tags (a member on runs they launched, an admin on any)."""
    data = data or NotesIn()
    run, notes, tags = lineage.check_annotate(request.user, run_id, notes=data.notes, tags=data.tags)
    lineage.do_annotate(request.user, run, notes, tags)
    return JsonResponse(actions.check_run_access(request.user, run.pk).detail())
