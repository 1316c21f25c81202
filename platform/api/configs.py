"""The configurations API: built-in presets (read-only) beside each team's saved ones.

GET  /api/configs                      both kinds, each with `kind` ("preset" | "saved")
POST /api/configs                      save version 1 of a new team configuration
GET  /api/configs/<id or preset name>  one saved version, or one built-in preset
POST /api/configs/<id>/versions        save an edited version (n+1); old ones stay
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from pydantic import BaseModel, ConfigDict, ValidationError

from api.http import api_login_required, json_object, refusal_response
from configs import actions
from configs.models import SavedConfig
from runs.errors import ActionError
from workers.presets import PRESETS


class ConfigIn(BaseModel):
    """POST /api/configs. The content is checked by the actions layer (its messages
    name the config fields)."""

    model_config = ConfigDict(extra="forbid")
    team: int | str | None = None
    name: Any = None
    description: Any = ""
    base_preset: Any = None
    overrides: Any = None


class VersionIn(BaseModel):
    """POST /api/configs/<id>/versions: what is left out is kept from that version."""

    model_config = ConfigDict(extra="forbid")
    description: Any = None
    base_preset: Any = None
    overrides: Any = None


def _saved_list(user) -> list[dict]:
    found = SavedConfig.objects.visible_to(user).select_related("team", "created_by")
    latest = set(found.latest_versions().values_list("pk", flat=True))
    return [{**saved.as_dict(), "latest": saved.pk in latest} for saved in found]


@require_http_methods(["GET", "POST"])
@api_login_required
def configs(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        return JsonResponse({"configs": actions.builtin_presets() + _saved_list(request.user)})
    try:
        data = ConfigIn.model_validate(json_object(request))
        save = actions.check_new_config(request.user, **data.model_dump())
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    saved = actions.do_save_config(request.user, save)
    return JsonResponse(saved.as_dict(), status=201)


@require_GET
@api_login_required
def config_detail(request: HttpRequest, config_id: str) -> JsonResponse:
    if config_id in PRESETS:
        return JsonResponse(next(p for p in actions.builtin_presets() if p["name"] == config_id))
    try:
        saved = actions.check_config_access(request.user, config_id)
    except ActionError as exc:
        return refusal_response(exc)
    versions = SavedConfig.objects.filter(team_id=saved.team_id, name=saved.name).values_list("pk", "version")
    return JsonResponse({**saved.as_dict(), "versions": [{"id": pk, "version": version} for pk, version in versions]})


@require_POST
@api_login_required
def config_versions(request: HttpRequest, config_id: str) -> JsonResponse:
    try:
        actions.refuse_builtin(config_id)
        previous = actions.check_config_access(request.user, config_id)
        data = VersionIn.model_validate(json_object(request))
        save = actions.check_new_version(request.user, previous, **data.model_dump())
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    saved = actions.do_save_config(request.user, save)
    return JsonResponse(saved.as_dict(), status=201)
