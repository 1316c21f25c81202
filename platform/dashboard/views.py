"""HTML pages: the runs list, the launch form and a run's live page.

Thin views: access and validation are the actions layer's; live data arrives in the
browser over WebSockets (runs/consumers.py) and the JSON API (api/views.py).
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods, require_POST

from configs import actions as config_actions
from configs.models import SavedConfig
from rollway import jsonin
from runs import actions, listing
from runs.errors import ActionError, NotFound
from runs.models import Experiment, Run
from teams.models import Team
from workers.metric_names import DASHBOARD_CHARTS, METRICS
from workers.presets import PRESETS

NO_SUCH_RUN = "No such run in your teams."
UNITS = {m.name: m.unit for m in METRICS}


# (sort key, column title) of the run list's sortable columns, left to right.
SORTABLE = [
    ("name", "Name"),
    ("status", "Status"),
    ("steps", "Steps"),
    ("reward", "Reward"),
    ("samples_per_s", "Samples/s"),
    ("duration", "Duration"),
    ("created", "Created"),
]


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """The run list: filters, search, sort and page from the URL (runs/listing.py)."""
    errors: dict[str, str] = {}
    try:
        query = listing.check_list_query(request.GET)
    except ActionError as exc:
        errors = exc.errors
        query = listing.ListQuery()
    page = listing.list_runs(request.user, query)
    for run in page.runs:
        run.row = listing.row(run)
        run.spark = listing.sparkline_path(run.sparkline)
    key = query.sort.lstrip("-")
    columns = [
        {
            "key": name,
            "title": title,
            # A click sorts by the column, the second click reverses; numbers and dates
            # start with the highest, names A→Z.
            "url": "?" + urlencode(query.params(sort=_next_sort(name, query.sort), page=1)),
            "sorted": "" if key != name else ("desc" if query.sort.startswith("-") else "asc"),
        }
        for name, title in SORTABLE
    ]
    teams = Team.objects.for_user(request.user)
    return render(
        request,
        "dashboard/runs.html",
        {
            "page": page,
            "runs": page.runs,
            "query": query,
            "errors": errors,
            "columns": columns,
            "statuses": Run.Status.values,
            "presets": sorted(PRESETS),
            "experiments": Experiment.objects.filter(team__in=teams).select_related("team"),
            "launchers": sorted(
                get_user_model()
                .objects.filter(memberships__team__in=teams)
                .values_list("username", flat=True)
                .distinct()
            ),
            "next_url": "?" + urlencode(query.params(page=query.page + 1)) if page.has_next else "",
            "prev_url": "?" + urlencode(query.params(page=query.page - 1)) if page.has_prev else "",
            "here": request.get_full_path(),
            "has_team": teams.exists(),
        },
        status=400 if errors else 200,
    )


def _next_sort(key: str, current: str) -> str:
    if current.lstrip("-") == key:
        return key if current.startswith("-") else f"-{key}"
    return key if key == "name" else f"-{key}"


@login_required
@require_POST
def cancel_many(request: HttpRequest) -> HttpResponse:
    """The run list's "Cancel selected": each checked run cancelled or refused on its own,
    then back to the list as it was (filters, sort, page)."""
    try:
        run_ids = actions.check_run_ids(request.POST.getlist("runs"))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        cancelled, refused = actions.do_cancel_runs(request.user, run_ids)
        if cancelled:
            messages.info(request, "Cancelling " + ", ".join(f"#{i}" for i in cancelled) + ".")
        for run_id, why in refused.items():
            messages.error(request, f"#{run_id} not cancelled: {why}")
    back = request.POST.get("next", "")
    # Only a path of this site: an open redirect would send people anywhere.
    return redirect(
        back if url_has_allowed_host_and_scheme(back, allowed_hosts=None) and back.startswith("/") else "dashboard:runs"
    )


SAVED_PREFIX = "saved:"  # the launch form's value for a saved configuration: saved:<id>


def _preset_choices(user) -> list[dict]:
    """The preset selector's groups: the built-in presets, then each of the user's
    teams' saved configurations (newest version of each name)."""
    groups = [
        {
            "label": "Built-in presets",
            "options": [
                {
                    "name": name,
                    "label": name,
                    "description": preset["description"],
                    "config_json": json.dumps(preset["config"].model_dump(mode="json"), indent=2),
                }
                for name, preset in PRESETS.items()
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
                "config_json": json.dumps(saved.effective_config().model_dump(mode="json"), indent=2),
            }
        )
    groups += [{"label": f"{team} configurations", "options": options} for team, options in by_team.items()]
    return groups


def _save_config(request: HttpRequest, form: dict, overrides: dict) -> SavedConfig:
    """The launch form's "Save as configuration": the team of the chosen experiment
    (or "team:<id>"), the chosen preset or saved configuration, the overrides."""
    experiment, _, team = form["experiment"].partition("team:")
    if experiment:
        team_obj = actions.check_experiment_access(request.user, experiment).team
    else:
        team_obj = actions.check_team_access(request.user, team)
    saved = None
    if form["preset"].startswith(SAVED_PREFIX):
        saved_id = form["preset"].removeprefix(SAVED_PREFIX)
        saved = actions.check_saved_config_access(request.user, saved_id, field="preset")
    save = config_actions.check_save_from_launch_form(
        request.user,
        team=team_obj,
        name=form["config_name"],
        description=form["config_description"],
        preset=form["preset"],
        saved=saved,
        overrides=overrides,
    )
    return config_actions.do_save_config(request.user, save)


@login_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    """The launch form. On any error nothing is created and the form comes back with
    each message next to its field (config fields by dotted path, e.g. buffer.capacity)."""
    experiments = Experiment.objects.filter(team__in=Team.objects.for_user(request.user)).select_related("team")
    form = {
        "experiment": request.POST.get("experiment", ""),
        "name": request.POST.get("name", ""),
        "preset": request.POST.get("preset", request.GET.get("preset", next(iter(PRESETS)))),
        "overrides": request.POST.get("overrides", "{}"),
        "config_name": request.POST.get("config_name", ""),
        "config_description": request.POST.get("config_description", ""),
    }
    errors: dict[str, str] = {}
    if request.method == "POST":
        try:
            overrides = jsonin.loads(form["overrides"] or "{}")
        except jsonin.BadJSON as exc:
            errors["overrides"] = str(exc)
        else:
            try:
                if request.POST.get("action") == "save":
                    saved = _save_config(request, form, overrides)
                    messages.success(request, f"Saved configuration {saved.label} in team {saved.team.name}.")
                    return redirect(f"{reverse('dashboard:launch')}?preset={SAVED_PREFIX}{saved.pk}")
                # "team:<id>" picks a team without experiments: its "default" one is made
                experiment, _, team = form["experiment"].partition("team:")
                # "saved:<id>" picks a team's saved configuration instead of a preset
                preset, _, saved_config = form["preset"].partition(SAVED_PREFIX)
                launch_request = actions.check_launch(
                    request.user,
                    experiment=experiment,
                    team=team,
                    name=form["name"],
                    preset=preset,
                    overrides=overrides,
                    saved_config=saved_config,
                )
            except ActionError as exc:
                errors = exc.errors
            else:
                run = actions.do_launch_run(request.user, launch_request)
                messages.success(request, f"Run #{run.pk} queued.")
                return redirect(run)
    if "team" in errors:
        errors["experiment"] = errors.pop("team")
    if "saved_config" in errors:
        errors["preset"] = errors.pop("saved_config")
    if request.POST.get("action") == "save":
        shown_at = {"name": "config_name", "description": "config_description", "base_preset": "preset"}
        for field in shown_at.keys() & errors.keys():
            errors[shown_at[field]] = errors.pop(field)
    simple = {"experiment", "name", "preset", "overrides", "config_name", "config_description", "config"}
    context = {
        "form": form,
        "experiment_choices": [(str(e.pk), f"{e.team.name} / {e.name}") for e in experiments]
        + [
            (f"team:{team.pk}", f"{team.name} / default (new)")
            for team in Team.objects.for_user(request.user).filter(experiments__isnull=True)
        ],
        "preset_groups": _preset_choices(request.user),
        "errors": errors,
        "field_errors": {k: v for k, v in errors.items() if k in simple},
        # Everything else came from the engine config: shown beside the overrides box.
        "config_errors": sorted((k, v) for k, v in errors.items() if k not in simple),
    }
    return render(request, "dashboard/launch.html", context, status=400 if errors else 200)


def _charts() -> list[dict]:
    return [
        {
            "id": f"chart-{slugify(title)}",
            "title": title,
            "series": ",".join(series),
            "unit": UNITS.get(series[0], ""),
        }
        for title, series in DASHBOARD_CHARTS
    ]


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        found = actions.check_run_access(request.user, run_id)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    return render(
        request,
        "dashboard/run.html",
        {
            "run": found,
            "config_json": json.dumps(found.config, indent=2),
            "overrides_json": json.dumps(found.overrides, indent=2),
            "charts": _charts(),
        },
    )


@login_required
@require_POST
def cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        found = actions.check_cancel(request.user, run_id)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        actions.do_cancel_run(request.user, found)
        messages.info(request, f"Cancelling run #{found.pk}.")
    return redirect("dashboard:run", run_id=run_id)
