"""The launch form as the page posts it: its fields, what their values encode, what it
asks of the actions layer (launch or clone a run, save the configuration) and where each
refusal is shown.

Two values encode a choice the actions take apart: the experiment "team:<id>" is a team
without experiments, whose "default" one the launch makes; the preset "saved:<id>" is a
team's saved configuration. Only the overrides JSON carries the config: launch.js keeps
it in step with the controls (dashboard/config_controls.py).
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest

from configs import actions as config_actions
from configs.models import SavedConfig
from dashboard.config_controls import controls_with_errors
from foundation import jsonin
from foundation.errors import ActionError, NotFound, nul_errors
from runs import actions, lineage
from runs.models import Experiment, Run
from teams import roles
from teams.models import Team
from workers.presets import PRESETS

SAVED_PREFIX = "saved:"
TEAM_PREFIX = "team:"
# Errors shown beside a field of the form; any other is a config field's, shown beside
# its control (or, when no control shows that path, beside the overrides box).
FORM_FIELDS = {"experiment", "name", "preset", "overrides", "priority", "config_name", "config_description", "config"}


class LaunchForm:
    """The form of one request. `submit` does what it asks; `errors` and `status` say
    why it was refused (403 when the role does not allow it, else 400)."""

    def __init__(self, request: HttpRequest) -> None:
        """Read the form; a clone ("clone" in the URL, "clone_of" posted) opens holding
        the run's preset and overrides. NotFound for a clone of a run the user may not see."""
        self.user = request.user
        self.posted = request.method == "POST"
        self.saving = request.POST.get("action") == "save"
        self.data = {
            "experiment": request.POST.get("experiment", ""),
            "name": request.POST.get("name", ""),
            "preset": request.POST.get("preset", request.GET.get("preset", next(iter(PRESETS)))),
            "overrides": request.POST.get("overrides", "{}"),
            "priority": request.POST.get("priority", "0"),
            "config_name": request.POST.get("config_name", ""),
            "config_description": request.POST.get("config_description", ""),
            # The launched run records that it is a clone of this one (runs/lineage.py).
            "clone_of": request.POST.get("clone_of", request.GET.get("clone", "")),
        }
        self.clone_of = self._clone_of()
        if self.clone_of is not None and not self.posted:
            self.data.update(
                experiment=str(self.clone_of.experiment_id),
                name=f"{self.clone_of.name} (clone)"[: actions.RUN_NAME_MAX],
                preset=self.clone_of.preset,
                overrides=json.dumps(self.clone_of.overrides, indent=2),
                priority=str(self.clone_of.priority),
            )
        self.errors: dict[str, str] = {}
        self.status = 200

    def _clone_of(self) -> Run | None:
        if not self.data["clone_of"]:
            return None
        try:
            return actions.check_run_access(self.user, int(self.data["clone_of"]))
        except ValueError:
            raise NotFound({"clone_of": "no such run"}) from None

    def submit(self) -> Run | SavedConfig | None:
        """The queued run, or the saved configuration version ("Save as configuration");
        None, with `errors`, when it was refused: nothing is created then."""
        self.errors = nul_errors(self.data)
        if not self.errors:
            try:
                overrides = jsonin.loads(self.data["overrides"] or "{}")
            except jsonin.BadJSON as exc:
                self.errors = {"overrides": str(exc)}
            else:
                try:
                    return self._save(overrides) if self.saving else self._launch(overrides)
                except ActionError as exc:
                    self.errors = exc.errors
                    self.status = exc.http_status
                    return None
        self.status = 400
        return None

    def _launch(self, overrides: dict) -> Run:
        experiment, _, team = self.data["experiment"].partition(TEAM_PREFIX)
        preset, _, saved_config = self.data["preset"].partition(SAVED_PREFIX)
        launch = actions.check_launch(
            self.user,
            experiment=experiment,
            team=team,
            name=self.data["name"],
            preset=preset,
            overrides=overrides,
            saved_config=saved_config,
            priority=self.data["priority"],
        )
        if self.clone_of is not None:
            return lineage.do_clone(self.user, self.clone_of, launch)
        return actions.do_launch_run(self.user, launch)

    def _save(self, overrides: dict) -> SavedConfig:
        """ "Save as configuration": in the team of the chosen experiment (or "team:<id>"),
        the chosen preset or saved configuration with the overrides."""
        experiment, _, team = self.data["experiment"].partition(TEAM_PREFIX)
        if experiment:
            team_obj = actions.check_experiment_access(self.user, experiment).team
        else:
            team_obj = roles.check_team_access(self.user, team)
        saved = None
        if self.data["preset"].startswith(SAVED_PREFIX):
            saved_id = self.data["preset"].removeprefix(SAVED_PREFIX)
            saved = config_actions.check_saved_config_access(self.user, saved_id, field="preset")
        save = config_actions.check_save_from_launch_form(
            self.user,
            team=team_obj,
            name=self.data["config_name"],
            description=self.data["config_description"],
            preset=self.data["preset"],
            saved=saved,
            overrides=overrides,
        )
        return config_actions.do_save_config(self.user, save)

    def shown_errors(self) -> dict[str, str]:
        """The errors by the form's own names for the fields they concern."""
        errors = dict(self.errors)
        if "team" in errors:
            errors["experiment"] = errors.pop("team")
        if "saved_config" in errors:
            errors["preset"] = errors.pop("saved_config")
        if self.saving:
            shown_at = {"name": "config_name", "description": "config_description", "base_preset": "preset"}
            for field in shown_at.keys() & errors.keys():
                errors[shown_at[field]] = errors.pop(field)
        return errors

    def context(self) -> dict:
        """What the template shows: the fields as given, the choices, and each error where
        it belongs."""
        errors = self.shown_errors()
        teams = Team.objects.for_user(self.user)
        experiments = Experiment.objects.visible_to(self.user).select_related("team")
        presets = preset_choices(self.user)
        control_groups, unplaced = controls_with_errors({k: v for k, v in errors.items() if k not in FORM_FIELDS})
        return {
            "form": self.data,
            "experiment_choices": [(str(e.pk), f"{e.team.name} / {e.name}") for e in experiments]
            + [
                (f"{TEAM_PREFIX}{team.pk}", f"{team.name} / default (new)")
                for team in teams.filter(experiments__isnull=True)
            ],
            "preset_groups": presets,
            # launch.js re-bases the controls on the chosen preset's (or configuration's) config.
            "preset_configs": {o["name"]: o["config"] for group in presets for o in group["options"]},
            "control_groups": control_groups,
            "priority_range": (actions.PRIORITY_MIN, actions.PRIORITY_MAX),
            "errors": errors,
            "field_errors": {k: v for k, v in errors.items() if k in FORM_FIELDS},
            # Everything else came from the engine config: beside its control, or when no
            # control shows that path (a section, an unknown field), beside the overrides box.
            "config_errors": sorted(unplaced.items()),
        }


def preset_choices(user) -> list[dict]:
    """The preset selector's groups: the built-in presets, then each of the user's
    teams' saved configurations (newest version of each name)."""
    groups: list[dict[str, Any]] = [
        {
            "label": "Built-in presets",
            "options": [
                {"name": p["name"], "label": p["name"], "description": p["description"], "config": p["config"]}
                for p in config_actions.builtin_presets()
            ],
        }
    ]
    by_team: dict[str, list[dict]] = {}
    for saved in SavedConfig.objects.visible_to(user).latest_versions().select_related("team"):
        by_team.setdefault(saved.team.name, []).append(
            {
                "name": f"{SAVED_PREFIX}{saved.pk}",
                "label": saved.label,
                "description": saved.description or f"{saved.base_preset} with overrides {json.dumps(saved.overrides)}",
                "config": saved.effective_config().model_dump(mode="json"),
            }
        )
    groups += [{"label": f"{team} configurations", "options": options} for team, options in by_team.items()]
    for option in (option for group in groups for option in group["options"]):
        option["config_json"] = json.dumps(option["config"], indent=2)
    return groups
