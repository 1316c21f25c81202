"""Saving team configurations: `check_*` validate and enforce access, `do_*` store.

A configuration is validated exactly as a launch is (`configs.policy.check_config`: the
engine's own model, then the operator's paths, limits and cluster), so what saves is
what launches and a refusal names the same fields. Built-in presets are code, never
rows: asking to edit one is refused with the way to derive a configuration from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from configs.models import SavedConfig
from configs.policy import check_config
from foundation.errors import ActionError, Conflict, NotFound
from foundation.fields import max_length
from teams import roles
from teams.models import Team
from teams.roles import check_team_access
from workers.config.presets import PRESETS, deep_merge
from workers.config.run_config import RunConfig

logger = logging.getLogger(__name__)

NAME_MAX = max_length(SavedConfig, "name")


@dataclass(frozen=True)
class SaveRequest:
    """A validated configuration version: everything `do_save_config` needs."""

    team: Team
    name: str
    description: str
    base_preset: str
    overrides: dict
    previous: SavedConfig | None  # the version this one edits; None: a new configuration


def builtin_presets() -> list[dict]:
    """The built-in presets as the configuration listings show them (read-only)."""
    return [
        {
            "kind": "preset",
            "name": name,
            "read_only": True,
            "description": preset["description"],
            "rewards_where": preset["rewards_where"],
            "config": preset_config(name).model_dump(mode="json"),
        }
        for name, preset in PRESETS.items()
    ]


def preset_config(name: str) -> RunConfig:
    """The config of built-in preset `name` (PRESETS keeps it beside its description)."""
    config = PRESETS[name]["config"]
    assert isinstance(config, RunConfig)
    return config


def refuse_builtin(name: str) -> None:
    """Conflict if `name` is a built-in preset: presets are code and stay read-only."""
    if name in PRESETS:
        raise Conflict(
            {
                "config": f"{name!r} is a built-in preset and is read-only; save a team "
                f'configuration based on it instead (POST /api/configs with "base_preset": "{name}")'
            }
        )


def check_saved_config_access(user, saved_config: Any, *, field: str = "saved_config") -> SavedConfig:
    """A saved configuration version of one of the user's teams, by id; ActionError on
    `field` otherwise (an outsider learns nothing about other teams' configurations)."""
    try:
        saved_id = int(saved_config)
    except (TypeError, ValueError):
        raise ActionError({field: f"must be a saved configuration id (got {saved_config!r})"}) from None
    found = SavedConfig.objects.visible_to(user).select_related("team").filter(pk=saved_id).first()
    if found is None:
        raise ActionError({field: f"no saved configuration {saved_id} in your teams"})
    return found


def check_config_access(user, config_id: Any) -> SavedConfig:
    """A saved configuration version of the user's teams; NotFound for anyone else."""
    try:
        return check_saved_config_access(user, config_id, field="config")
    except ActionError as exc:
        raise NotFound(exc.errors) from None


def _check_content(
    errors: dict[str, str], name: Any, description: Any, base_preset: Any, overrides: Any
) -> tuple[str, str, str, dict]:
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > NAME_MAX:
        errors["name"] = f"must be 1 to {NAME_MAX} characters"
        name = ""
    name = name.strip()
    if name in PRESETS:
        errors["name"] = f"{name!r} is a built-in preset's name; choose another"
    if not isinstance(description, str):
        errors["description"] = "must be a string"
        description = ""
    if not isinstance(base_preset, str) or base_preset not in PRESETS:
        errors["base_preset"] = f"choose a built-in preset: {', '.join(sorted(PRESETS))}"
    if overrides in (None, ""):
        overrides = {}
    if not isinstance(overrides, dict):
        errors["overrides"] = 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}'
    elif "base_preset" not in errors:
        _, config_errors = check_config(base_preset, overrides)
        errors.update(config_errors)
    return name, description, base_preset, overrides


def check_new_config(
    user, *, team: Any, name: Any, base_preset: Any, overrides: Any = None, description: Any = ""
) -> SaveRequest:
    """Version 1 of a new configuration in one of the user's teams; ActionError with
    every field error at once (nothing is stored), Conflict if the name is taken."""
    errors: dict[str, str] = {}
    team_obj = None
    try:
        team_obj = check_team_access(user, team) if team not in (None, "") else None
    except ActionError as exc:
        errors.update(exc.errors)
    if team_obj is None and "team" not in errors:
        errors["team"] = "choose one of your teams (id or slug)"
    if team_obj is not None:
        roles.require(user, team_obj, "save configurations")
    name, description, base_preset, overrides = _check_content(errors, name, description, base_preset, overrides)
    if errors:
        raise ActionError(errors)
    assert team_obj is not None  # else "team" is among the errors
    existing = SavedConfig.objects.filter(team=team_obj, name=name).order_by("-version").first()
    if existing is not None:
        raise Conflict(
            {
                "name": f"team {team_obj.slug} already has a configuration {name!r} (v{existing.version}); "
                f"save a new version with POST /api/configs/{existing.pk}/versions"
            }
        )
    return SaveRequest(team_obj, name, description, base_preset, overrides, previous=None)


def check_new_version(
    user, previous: SavedConfig, *, base_preset: Any = None, overrides: Any = None, description: Any = None
) -> SaveRequest:
    """The next version of `previous`'s configuration (a version the user may see:
    `check_config_access`): whatever is not given is kept from `previous`."""
    roles.require(user, previous.team, "save configurations", field="config")
    errors: dict[str, str] = {}
    _, description, base_preset, overrides = _check_content(
        errors,
        previous.name,
        previous.description if description is None else description,
        previous.base_preset if base_preset is None else base_preset,
        previous.overrides if overrides is None else overrides,
    )
    if errors:
        raise ActionError(errors)
    return SaveRequest(previous.team, previous.name, description, base_preset, overrides, previous=previous)


def do_save_config(user, request: SaveRequest) -> SavedConfig:
    """Store the configuration version; a new configuration is version 1, an edit the
    newest version + 1. The unique (team, name, version) constraint decides between two
    concurrent saves: the loser is a Conflict and stores nothing."""
    version = 1
    if request.previous is not None:
        version = request.previous.newest_version() + 1
    try:
        with transaction.atomic():
            saved = SavedConfig.objects.create(
                team=request.team,
                name=request.name,
                version=version,
                description=request.description,
                base_preset=request.base_preset,
                overrides=request.overrides,
                created_by=user,
            )
    except IntegrityError:
        raise Conflict(
            {"name": f"configuration {request.name!r} v{version} was just saved by someone else; reload and retry"}
        ) from None
    logger.info("configuration %s (%s) saved by %s in team %s", saved.pk, saved.label, user, request.team.slug)
    return saved


def check_save_from_launch_form(
    user, *, team: Team, name: Any, description: Any, preset: str, saved: SavedConfig | None, overrides: Any
) -> SaveRequest:
    """The launch form's "Save as configuration": its preset (or the saved version it
    shows, whose base preset and overrides the form's overrides go on top of) under
    `name`. A name the team already uses saves that configuration's next version."""
    if not isinstance(overrides, dict):
        raise ActionError({"overrides": 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}'})
    if saved is not None:
        preset, overrides = saved.base_preset, deep_merge(saved.overrides, overrides)
    clean_name = name.strip() if isinstance(name, str) else name
    existing = SavedConfig.objects.filter(team=team, name=clean_name).order_by("-version").first()
    if existing is not None:
        # A blank description keeps the one the configuration has.
        return check_new_version(
            user, existing, base_preset=preset, overrides=overrides, description=description or None
        )
    return check_new_config(
        user, team=team.pk, name=name, base_preset=preset, overrides=overrides, description=description
    )
