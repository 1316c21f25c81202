"""The configurations API: built-in presets (read-only) beside each team's saved ones.

GET  /api/configs                      both kinds, each with `kind` ("preset" | "saved")
POST /api/configs                      save version 1 of a new team configuration
GET  /api/configs/<id or preset name>  one saved version, or one built-in preset
POST /api/configs/<id>/versions        save an edited version (n+1); old ones stay
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict

from api.openapi import responses
from configs import actions
from configs.models import SavedConfig
from workers.config.presets import PRESETS

router = Router(tags=["configs"])


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


class Configs(Schema):
    configs: list[dict[str, Any]]


def _saved_list(user) -> list[dict]:
    found = SavedConfig.objects.visible_to(user).select_related("team", "created_by")
    latest = set(found.latest_versions().values_list("pk", flat=True))
    return [{**saved.as_dict(), "latest": saved.pk in latest} for saved in found]


@router.get("/configs", url_name="configs", response=responses(Configs))
def list_configs(request: HttpRequest) -> JsonResponse:
    """The built-in presets and your teams' saved configurations (every version)."""
    return JsonResponse({"configs": actions.builtin_presets() + _saved_list(request.user)})


@router.post("/configs", url_name="configs", response=responses(dict[str, Any], 201, 400, 403, 404))
def save_config(request: HttpRequest, data: ConfigIn | None = None) -> JsonResponse:
    """Save version 1 of a new team configuration: a base preset and overrides."""
    save = actions.check_new_config(request.user, **(data or ConfigIn()).model_dump())
    saved = actions.do_save_config(request.user, save)
    return JsonResponse(saved.as_dict(), status=201)


@router.get("/configs/{str:config_id}", url_name="config", response=responses(dict[str, Any], 200, 404))
def get_config(request: HttpRequest, config_id: str) -> JsonResponse:
    """One saved version (by id) with its siblings' ids, or a built-in preset (by name)."""
    if config_id in PRESETS:
        return JsonResponse(next(p for p in actions.builtin_presets() if p["name"] == config_id))
    saved = actions.check_config_access(request.user, config_id)
    versions = SavedConfig.objects.filter(team_id=saved.team_id, name=saved.name).values_list("pk", "version")
    return JsonResponse({**saved.as_dict(), "versions": [{"id": pk, "version": version} for pk, version in versions]})


@router.post(
    "/configs/{str:config_id}/versions",
    url_name="config-versions",
    response=responses(dict[str, Any], 201, 400, 403, 404),
)
def save_config_version(request: HttpRequest, config_id: str, data: VersionIn | None = None) -> JsonResponse:
    """Save an edited version (n+1) of a saved configuration; what is left out is kept."""
    actions.refuse_builtin(config_id)
    previous = actions.check_config_access(request.user, config_id)
    save = actions.check_new_version(request.user, previous, **(data or VersionIn()).model_dump())
    saved = actions.do_save_config(request.user, save)
    return JsonResponse(saved.as_dict(), status=201)
