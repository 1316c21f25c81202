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
from foundation.ids import ID_TEXT
from runs import actions, lineage, simulation, sinks
from runs.models import Experiment, Run
from teams import roles
from teams.models import Team
from workers.config.presets import PRESETS

SAVED_PREFIX = "saved:"
TEAM_PREFIX = "team:"
# Errors shown beside a field of the form; any other is a config field's, shown beside
# its control (or, when no control shows that path, beside the overrides box).
FORM_FIELDS = {
    "experiment",
    "name",
    "preset",
    "overrides",
    "priority",
    "trackers",
    "config_name",
    "config_description",
    "config",
}
# The Simulate button's fields (runs/simulation.py): posted as "cluster.gpus" etc., each
# refusal shown under its own name.
CLUSTER_FIELDS = ("gpus", "gpu", "model", "inference_share", "tp", "link")
WORKLOAD_FIELDS = ("median_tokens", "p90_tokens", "max_tokens", "prompt_tokens")
SIMULATION_FIELDS = (
    [f"cluster.{f}" for f in CLUSTER_FIELDS]
    + [f"workload.{f}" for f in WORKLOAD_FIELDS]
    + ["cluster", "workload", "steps", "goal_samples"]
)
# The Simulate fields as the form shows them: (name, label, kind, default, extra), the
# defaults a 64-GPU H100 cluster, 7B, half generating, and long-tailed reasoning
# completions (median 2K, p90 8K tokens).
SIMULATION_INPUTS: tuple[tuple[str, str, str, str, dict], ...] = (
    ("cluster.gpus", "GPUs", "number", "64", {"min": 1, "step": 1}),
    ("cluster.gpu", "GPU kind", "select", "H100", {"options": tuple(simulation.DEVICES)}),
    ("cluster.model", "Model (7B, 32B or a Hugging Face model path)", "text", "7B", {}),
    ("cluster.inference_share", "Share of the GPUs that generate", "number", "0.5", {"min": 0, "max": 1, "step": 0.05}),
    ("cluster.tp", "GPUs per inference worker (TP)", "number", "1", {"min": 1, "step": 1}),
    ("cluster.link", "Link between nodes", "select", "InfiniBand", {"options": simulation.LINK_CHOICES}),
    ("workload.median_tokens", "Completion length, median (tokens)", "number", "2048", {"min": 1, "step": 1}),
    ("workload.p90_tokens", "Completion length, p90 (tokens)", "number", "8192", {"min": 1, "step": 1}),
    ("workload.max_tokens", "Completion cut (tokens)", "number", "32768", {"min": 1, "step": 1}),
    ("workload.prompt_tokens", "Prompt length (tokens)", "number", "512", {"min": 1, "step": 1}),
    ("steps", "Steps", "number", "", {"min": 1, "step": 1, "placeholder": "the config's stop.max_steps"}),
    (
        "goal_samples",
        "Plan's goal: trained samples (Plan only)",
        "number",
        "",
        {"min": 1, "step": 1, "placeholder": "empty: the most samples/s"},
    ),
)
SIMULATION_DEFAULTS = {name: default for name, _, _, default, _ in SIMULATION_INPUTS}


class LaunchForm:
    """The form of one request. `submit` does what it asks; `errors` and `status` say
    why it was refused (403 when the role does not allow it, else 400)."""

    def __init__(self, request: HttpRequest) -> None:
        """Read the form; a clone ("clone" in the URL, "clone_of" posted) opens holding
        the run's preset and overrides. NotFound for a clone of a run the user may not see."""
        self.user = request.user
        self.posted = request.method == "POST"
        self.saving = request.POST.get("action") == "save"
        self.simulating = request.POST.get("action") == "simulate"
        self.planning = request.POST.get("action") == "plan"
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
        # The tracker boxes (shown where the site has trackers): "trackers_shown" tells
        # none ticked ([]: export nowhere) from a form without them (None: the site's).
        self.trackers: list[str] | None = (
            request.POST.getlist("trackers") if request.POST.get("trackers_shown") else None
        )
        self.simulation = {key: request.POST.get(key, default) for key, default in SIMULATION_DEFAULTS.items()}
        self.clone_of = self._clone_of()
        if self.clone_of is not None and not self.posted:
            self.data.update(
                experiment=str(self.clone_of.experiment_id),
                name=f"{self.clone_of.name} (clone)"[: actions.RUN_NAME_MAX],
                preset=self.clone_of.preset,
                overrides=json.dumps(self.clone_of.overrides, indent=2),
                priority=str(self.clone_of.priority),
            )
            self.trackers = self.clone_of.trackers
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
        self.errors = nul_errors(self.data | self.simulation)
        if not self.errors:
            try:
                overrides = jsonin.loads(self.data["overrides"] or "{}")
            except jsonin.BadJSON as exc:
                self.errors = {"overrides": str(exc)}
            else:
                try:
                    if self.saving:
                        return self._save(overrides)
                    if self.planning:
                        return self._plan(overrides)
                    return self._simulate(overrides) if self.simulating else self._launch(overrides)
                except ActionError as exc:
                    self.errors = exc.errors
                    self.status = exc.http_status
                    return None
        self.status = 400
        return None

    def _launch_fields(self, overrides: dict) -> dict[str, Any]:
        experiment, _, team = self.data["experiment"].partition(TEAM_PREFIX)
        preset, _, saved_config = self.data["preset"].partition(SAVED_PREFIX)
        return {
            "experiment": experiment,
            "team": team,
            "name": self.data["name"],
            "preset": preset,
            "overrides": overrides,
            "saved_config": saved_config,
            "priority": self.data["priority"],
            "trackers": self.trackers,
        }

    def _launch(self, overrides: dict) -> Run:
        """A launch into the chosen experiment; a clone's too, which only records its
        parent (the role it needs is the one in the chosen experiment's team)."""
        if self.clone_of is not None:
            launch = lineage.check_clone_launch(self.user, self.clone_of, **self._launch_fields(overrides))
            return lineage.do_clone(self.user, self.clone_of, launch)
        launch = actions.check_launch(self.user, **self._launch_fields(overrides))
        return actions.do_launch_run(self.user, launch)

    def _simulate(self, overrides: dict) -> Run:
        """ "Simulate": the launch's config on the form's cluster and workload (an empty
        box: the simulator's default), stored as a finished, simulated run."""
        return simulation.do_simulate_run(self.user, *self._simulated_launch(overrides))

    def _plan(self, overrides: dict) -> Run:
        """ "Plan": the settings searched on the form's cluster and workload; the best
        one's simulated run (the config as given is simulated beside it)."""
        launch, sim, goal = simulation.check_plan(
            self.user, goal_samples=self.simulation["goal_samples"], **self._simulation_fields(overrides)
        )
        return simulation.do_plan(self.user, launch, sim, goal).best

    def _simulated_launch(self, overrides: dict) -> tuple[actions.LaunchRequest, simulation.SimulationRequest]:
        return simulation.check_simulated_launch(self.user, **self._simulation_fields(overrides))

    def _simulation_fields(self, overrides: dict) -> dict[str, Any]:
        given = {key: value.strip() for key, value in self.simulation.items() if value.strip()}
        return {
            "cluster": {f: given[f"cluster.{f}"] for f in CLUSTER_FIELDS if f"cluster.{f}" in given},
            "workload": {f: given[f"workload.{f}"] for f in WORKLOAD_FIELDS if f"workload.{f}" in given},
            # ASCII digits only: "²" is a digit to str.isdigit() and not to int().
            "steps": int(given["steps"]) if ID_TEXT.fullmatch(given.get("steps", "")) else given.get("steps"),
            **self._launch_fields(overrides),
        }

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
        control_groups, unplaced = controls_with_errors(
            {k: v for k, v in errors.items() if k not in FORM_FIELDS and k not in SIMULATION_FIELDS}
        )
        return {
            "form": self.data,
            "simulation_fields": [
                {
                    "name": name,
                    "id": "id_" + name.replace(".", "_"),
                    "label": label,
                    "kind": kind,
                    "value": self.simulation[name],
                    "error": errors.get(name, ""),
                    **extra,
                }
                for name, label, kind, _, extra in SIMULATION_INPUTS
            ],
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
            # The site's trackers, each ticked unless the form (or the cloned run) chose others.
            "tracker_choices": [
                {"key": s.KEY, "name": s.NAME, "checked": self.trackers is None or s.KEY in self.trackers}
                for s in sinks.configured()
            ],
            "errors": errors,
            "field_errors": {k: v for k, v in errors.items() if k in FORM_FIELDS or k in SIMULATION_FIELDS},
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
                {
                    "name": p["name"],
                    "label": p["name"],
                    "description": p["description"],
                    "rewards_where": p["rewards_where"],
                    "config": p["config"],
                }
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
