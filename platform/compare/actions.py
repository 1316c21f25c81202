"""Launching comparison experiments: `check_*` validate and enforce access, `do_*` store
and launch.

A comparison launches one run per (configuration, seed) through the same path a single
launch takes (`runs.actions.check_launch`, then `do_launch_run`), so every run waits in
the run queue and a configuration that would not launch alone is refused here with the
same field names. The whole set is one transaction: either every run is queued or none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from compare.analysis import MAX_RUNS
from compare.models import SAVED_PREFIX, Comparison, ComparisonRun
from configs.actions import check_saved_config_access
from configs.models import SavedConfig
from foundation.errors import ActionError, NotFound, collected
from foundation.fields import max_length
from foundation.ids import ID_TEXT
from runs.actions import (
    LaunchRequest,
    ask_scheduler,
    check_experiment_access,
    check_launch,
    check_priority,
    check_team_queue,
    do_launch_run,
)
from runs.models import Experiment, Run
from teams import audit, roles
from teams.models import Team
from teams.roles import check_team_access
from workers.config.presets import PRESETS, deep_merge

logger = logging.getLogger(__name__)

NAME_MAX = max_length(Comparison, "name")
# A comparison's runs all land in the run queue at once and are shown on one compare
# page, which draws at most `analysis.MAX_RUNS` runs; these caps keep one form from
# flooding the queue and keep every run of a comparison on its page (reruns included).
MAX_CONFIGURATIONS = 20
MAX_SEEDS = 10


@dataclass(frozen=True)
class ComparisonRequest:
    """A validated comparison (or another launch of one): everything `do_*` needs."""

    team: Team
    experiment: Experiment | None
    name: str
    description: str
    overrides: dict
    configurations: list[str]
    seeds: list[int]
    launches: list[tuple[str, int, LaunchRequest]]  # (configuration, seed, its launch)
    priority: int = 0  # every run's place in the queue (runs.actions.check_priority)


def check_comparison_access(user, comparison_id: Any) -> Comparison:
    """A comparison of one of the user's teams; NotFound for anyone else."""
    try:
        pk = int(comparison_id)
    except (TypeError, ValueError):
        raise NotFound({"comparison": f"comparison {comparison_id!r} not found"}) from None
    found = Comparison.objects.visible_to(user).select_related("team", "experiment").filter(pk=pk).first()
    if found is None:
        raise NotFound({"comparison": f"comparison {pk} not found"})
    return found


def check_seeds(value: Any, *, field: str = "seeds") -> list[int]:
    """A non-empty list of distinct non-negative ints (a "0,1,2" string as a form sends
    it is read as one); ActionError on `field` otherwise."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(" ", ",").split(",") if p.strip()]
        value = [int(p) if ID_TEXT.fullmatch(p) else p for p in parts]
    if not isinstance(value, list) or not value:
        raise ActionError({field: "give a non-empty list of seeds, e.g. [0, 1, 2]"})
    seeds: list[int] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ActionError({field: f"seeds are non-negative integers (got {item!r})"})
        if item in seeds:
            raise ActionError({field: f"seed {item} is given twice; each seed runs once per configuration"})
        seeds.append(item)
    if len(seeds) > MAX_SEEDS:
        raise ActionError({field: f"at most {MAX_SEEDS} seeds (got {len(seeds)})"})
    return seeds


def _configuration(user, team: Team | None, entry: Any) -> tuple[str, str, SavedConfig | None]:
    """(the stored entry, its label, the saved version or None) for a preset name, a
    saved configuration id or "saved:<id>"; ActionError on "configurations"."""
    if isinstance(entry, str) and entry in PRESETS:
        return entry, entry, None
    raw = entry[len(SAVED_PREFIX) :] if isinstance(entry, str) and entry.startswith(SAVED_PREFIX) else entry
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit())):
        raise ActionError(
            {
                "configurations": f"unknown configuration {entry!r}: give a built-in preset "
                f'({", ".join(sorted(PRESETS))}) or a saved configuration id ("saved:<id>")'
            }
        )
    try:
        saved = check_saved_config_access(user, raw, field="configurations")
    except ActionError:
        raise ActionError({"configurations": f"no saved configuration {raw} in your teams"}) from None
    if team is not None and saved.team_id != team.pk:
        raise ActionError(
            {"configurations": f"configuration {saved.label!r} belongs to team {saved.team.name}, not {team.name}"}
        )
    return f"{SAVED_PREFIX}{saved.pk}", saved.label, saved


def _check_launches(
    user,
    *,
    errors: dict[str, str],
    team: Team | None,
    experiment: Experiment | None,
    name: str,
    configurations: Any,
    seeds: list[int],
    overrides: dict,
    priority: int = 0,
) -> tuple[list[str], list[tuple[str, int, LaunchRequest]]]:
    entries: list[tuple[str, str, SavedConfig | None]] = []
    if not isinstance(configurations, list) or not configurations:
        errors["configurations"] = "choose at least one configuration (a built-in preset or a saved one)"
    elif len(configurations) > MAX_CONFIGURATIONS:
        errors["configurations"] = f"at most {MAX_CONFIGURATIONS} configurations (got {len(configurations)})"
    else:
        for entry in configurations:
            try:
                found = _configuration(user, team, entry)
            except ActionError as exc:
                errors.update(exc.errors)
                break
            if any(found[0] == e[0] for e in entries):
                errors["configurations"] = f"configuration {found[1]!r} is given twice"
                break
            entries.append(found)
    if errors or team is None:
        return [], []
    launches = []
    # Seed-major: the queue starts every configuration's first seed before any second
    # one, so a comparison's first results cover every configuration, and whatever else
    # the host is doing for a while falls on runs of several configurations, not on all
    # the seeds of one.
    for seed in seeds:
        for stored, label, saved in entries:
            try:
                launch = check_launch(
                    user,
                    experiment=experiment.pk if experiment else None,
                    team=team.pk,
                    name=f"{name} · {label} · seed {seed}",
                    preset="" if saved else stored,
                    overrides=deep_merge(overrides, {"seed": seed}),
                    saved_config=saved.pk if saved else None,
                    priority=priority,
                )
            except ActionError as exc:
                # The same field names a single launch gives, said of this run.
                for field, message in exc.errors.items():
                    errors.setdefault(field, f"{label}, seed {seed}: {message}")
                continue
            launches.append((stored, seed, launch))
    return [e[0] for e in entries], launches


def check_comparison(
    user,
    *,
    team: Any = None,
    experiment: Any = None,
    name: Any = "",
    description: Any = "",
    configurations: Any = None,
    seeds: Any = None,
    overrides: Any = None,
    priority: Any = None,
) -> ComparisonRequest:
    """Validate a new comparison; ActionError with every field error found (nothing is
    stored). Every run gets `priority` in the queue."""
    errors: dict[str, str] = {}
    exp_obj, team_obj = _check_place(user, experiment, team, errors)
    name, description, overrides = _check_shared(name, description, overrides, errors)
    seed_list: list[int] = []
    with collected(errors):
        seed_list = check_seeds(seeds)
    # Checked once here: per run it would repeat the same message for every run.
    with collected(errors):
        role = roles.role_of(user, team_obj) if team_obj is not None else None
        priority = check_priority(priority, role=role, team=team_obj)
    n_configs = len(configurations) if isinstance(configurations, list) else 0
    if seed_list and n_configs and n_configs * len(seed_list) > MAX_RUNS:
        errors["seeds"] = (
            f"{n_configs} configurations × {len(seed_list)} seeds is {n_configs * len(seed_list)} runs; "
            f"a comparison holds at most {MAX_RUNS} (what its compare page shows)"
        )
    if not errors and team_obj is not None and seed_list and n_configs:
        check_team_queue(team_obj, adding=n_configs * len(seed_list))  # all of them, or none
    if errors:  # the per-run checks below would only repeat these
        _check_launches(
            user, errors=errors, team=team_obj, experiment=exp_obj, name=name,
            configurations=configurations, seeds=[], overrides=overrides,
        )  # fmt: skip
        raise ActionError(errors)
    stored, launches = _check_launches(
        user, errors=errors, team=team_obj, experiment=exp_obj, name=name,
        configurations=configurations, seeds=seed_list, overrides=overrides, priority=priority,
    )  # fmt: skip
    if errors:
        raise ActionError(errors)
    assert team_obj is not None  # else "team" is among the errors
    return ComparisonRequest(team_obj, exp_obj, name, description, overrides, stored, seed_list, launches, priority)


def _check_place(user, experiment: Any, team: Any, errors: dict[str, str]) -> tuple[Experiment | None, Team | None]:
    """Where the comparison's runs land: the experiment given (team, if given too, must be
    its own), else the team's. Launching there needs a role that may (Forbidden, at once)."""
    exp_obj = team_obj = None
    with collected(errors):
        if experiment not in (None, ""):
            exp_obj = check_experiment_access(user, experiment)
            team_obj = exp_obj.team
            if team not in (None, "") and str(team) not in (str(team_obj.pk), team_obj.slug):
                errors["team"] = f"experiment {exp_obj.name!r} is in team {team_obj.name}; leave team out"
        elif team not in (None, ""):
            team_obj = check_team_access(user, team)
        else:
            errors["team"] = "choose one of your teams (or an experiment of one)"
    if team_obj is not None:
        roles.require(user, team_obj, "launch comparisons", field="experiment" if exp_obj else "team")
    return exp_obj, team_obj


def _check_shared(name: Any, description: Any, overrides: Any, errors: dict[str, str]) -> tuple[str, str, dict]:
    """The comparison's name, description and the overrides every configuration shares."""
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > NAME_MAX:
        errors["name"] = f"must be 1 to {NAME_MAX} characters"
        name = ""
    if not isinstance(description, str):
        errors["description"] = "must be a string"
        description = ""
    if overrides in (None, ""):
        overrides = {}
    if not isinstance(overrides, dict):
        errors["overrides"] = 'must be a JSON object, e.g. {"task": {"name": "reverse"}}'
        overrides = {}
    elif "seed" in overrides:
        errors["overrides"] = "leave seed out of the shared overrides: give the seeds in seeds"
    return name.strip(), description, overrides


def check_rerun(user, comparison: Comparison, *, seeds: Any = None, priority: Any = None) -> ComparisonRequest:
    """Another launch of `comparison` (one the user may see: `check_comparison_access`):
    every configuration once per seed, `seeds` defaulting to the comparison's first
    ones, each run at `priority` in the queue (0 unless given). The runs it has are
    kept, so the total is capped as a new comparison is."""
    roles.require(user, comparison.team, "launch comparisons", field="comparison")
    errors: dict[str, str] = {}
    try:
        priority = check_priority(priority, role=roles.role_of(user, comparison.team), team=comparison.team)
    except ActionError as exc:
        errors.update(exc.errors)
    seed_list: list[int] = []
    try:
        seed_list = check_seeds(comparison.seeds[:MAX_SEEDS] if seeds in (None, "", []) else seeds)
    except ActionError as exc:
        errors.update(exc.errors)
    have = comparison.members.count()
    adding = len(comparison.configurations) * len(seed_list)
    if seed_list and have + adding > MAX_RUNS:
        errors["seeds"] = (
            f"this comparison has {have} runs; {adding} more would pass the {MAX_RUNS} its compare page shows"
        )
    if errors:
        raise ActionError(errors)
    check_team_queue(comparison.team, adding=adding)  # all of them, or none
    stored, launches = _check_launches(
        user, errors=errors, team=comparison.team, experiment=comparison.experiment, name=comparison.name,
        configurations=comparison.configurations, seeds=seed_list, overrides=comparison.overrides,
        priority=priority,
    )  # fmt: skip
    if errors:
        raise ActionError(errors)
    return ComparisonRequest(
        comparison.team, comparison.experiment, comparison.name, comparison.description,
        comparison.overrides, stored, seed_list, launches, priority,
    )  # fmt: skip


def _launch_all(user, comparison: Comparison, request: ComparisonRequest) -> list[Run]:
    runs = []
    for stored, _seed, launch in request.launches:
        run = do_launch_run(user, launch, schedule=False)
        ComparisonRun.objects.create(comparison=comparison, run=run, configuration=stored)
        runs.append(run)
    ask_scheduler()  # one look at the queue for all of them
    return runs


def do_launch_comparison(user, request: ComparisonRequest) -> Comparison:
    """Store the comparison and queue its runs, all in one transaction."""
    with transaction.atomic():
        comparison = Comparison.objects.create(
            team=request.team,
            experiment=request.experiment,
            name=request.name,
            description=request.description,
            created_by=user,
            overrides=request.overrides,
            configurations=request.configurations,
            seeds=request.seeds,
        )
        runs = _launch_all(user, comparison, request)
        audit.record(user, comparison.team, audit.Action.COMPARE, f"comparison {comparison.pk}", runs=len(runs))
    logger.info("comparison %s (%s) launched %d runs for %s", comparison.pk, comparison.name, len(runs), user)
    return comparison


def do_rerun_comparison(user, comparison: Comparison, request: ComparisonRequest) -> list[Run]:
    """Queue another set of the comparison's runs beside the ones it has; seeds it had
    not run before join its `seeds`."""
    with transaction.atomic():
        runs = _launch_all(user, comparison, request)
        new_seeds = [s for s in request.seeds if s not in comparison.seeds]
        if new_seeds:
            comparison.seeds = [*comparison.seeds, *new_seeds]
            comparison.save(update_fields=["seeds"])
        audit.record(user, comparison.team, audit.Action.RERUN, f"comparison {comparison.pk}", runs=len(runs))
    logger.info("comparison %s launched again: %d more runs for %s", comparison.pk, len(runs), user)
    return runs
