"""HTML pages: the runs list, the launch form and a run's live page.

Thin views: access and validation are the actions layer's; live data arrives in the
browser over WebSockets (runs/consumers.py) and the JSON API (api/views.py).
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods, require_POST

from rollway import jsonin
from runs import actions
from runs.errors import ActionError, NotFound
from runs.models import Experiment, Run
from teams.models import Team
from workers.metric_names import DASHBOARD_CHARTS, METRICS
from workers.presets import PRESETS

RUNS_PAGE_LIMIT = 200
NO_SUCH_RUN = "No such run in your teams."
UNITS = {m.name: m.unit for m in METRICS}


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    found = Run.objects.visible_to(request.user).select_related("experiment__team", "launched_by")
    return render(
        request,
        "dashboard/runs.html",
        {"runs": found[:RUNS_PAGE_LIMIT], "has_team": Team.objects.for_user(request.user).exists()},
    )


def _preset_choices() -> list[dict]:
    return [
        {
            "name": name,
            "description": preset["description"],
            "config_json": json.dumps(preset["config"].model_dump(mode="json"), indent=2),
        }
        for name, preset in PRESETS.items()
    ]


@login_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    """The launch form. On any error nothing is created and the form comes back with
    each message next to its field (config fields by dotted path, e.g. buffer.capacity)."""
    experiments = Experiment.objects.filter(team__in=Team.objects.for_user(request.user)).select_related("team")
    form = {
        "experiment": request.POST.get("experiment", ""),
        "name": request.POST.get("name", ""),
        "preset": request.POST.get("preset", next(iter(PRESETS))),
        "overrides": request.POST.get("overrides", "{}"),
    }
    errors: dict[str, str] = {}
    if request.method == "POST":
        try:
            overrides = jsonin.loads(form["overrides"] or "{}")
        except jsonin.BadJSON as exc:
            errors["overrides"] = str(exc)
        else:
            try:
                # "team:<id>" picks a team without experiments: its "default" one is made
                experiment, _, team = form["experiment"].partition("team:")
                launch_request = actions.check_launch(
                    request.user,
                    experiment=experiment,
                    team=team,
                    name=form["name"],
                    preset=form["preset"],
                    overrides=overrides,
                )
            except ActionError as exc:
                errors = exc.errors
            else:
                run = actions.do_launch_run(request.user, launch_request)
                messages.success(request, f"Run #{run.pk} queued.")
                return redirect(run)
    if "team" in errors:
        errors["experiment"] = errors.pop("team")
    simple = {"experiment", "name", "preset", "overrides"}
    context = {
        "form": form,
        "experiment_choices": [(str(e.pk), f"{e.team.name} / {e.name}") for e in experiments]
        + [
            (f"team:{team.pk}", f"{team.name} / default (new)")
            for team in Team.objects.for_user(request.user).filter(experiments__isnull=True)
        ],
        "presets": _preset_choices(),
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
