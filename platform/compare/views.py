"""The compare page and its JSON/CSV API. Thin: the work is in compare/analysis.py."""

from __future__ import annotations

import csv
import io
import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from compare import actions, analysis, league
from compare.models import SAVED_PREFIX, Comparison
from configs.models import SavedConfig
from foundation import jsonin
from foundation.errors import ActionError, nul_errors
from foundation.http import BadParam, api_login_required, float_param, int_param, refusal_response
from runs.actions import PRIORITY_MAX, PRIORITY_MIN
from runs.models import Experiment, MetricPoint, Run
from teams.models import Team
from workers.config.presets import PRESETS
from workers.core.metric_names import NAMES as METRIC_NAMES
from workers.core.metric_names import PER_RANK, is_agent_series, is_reward_func_series

DEFAULT_TARGET = 0.8
DEFAULT_BUDGET_S = 60.0
X_AXES = ("step", "wall", "samples")


def metric_names_param(request: HttpRequest) -> list[str] | None:
    """`series=a,b`: the metrics whose chart series to send (empty: none; absent: all)."""
    raw = request.GET.get("series")
    if raw is None:
        return None
    names = [n for n in raw.split(",") if n]
    unknown = [
        n
        for n in names
        if (n not in METRIC_NAMES and not is_reward_func_series(n) and not is_agent_series(n)) or n in PER_RANK
    ]
    if unknown:
        raise BadParam("series", f"unknown metric {unknown[0]!r}: name metrics the answer lists in 'metrics'")
    return names


def _choice(request: HttpRequest, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.GET.get(name) or default
    if value not in choices:
        raise BadParam(name, f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


def page_context(runs: list[Run]) -> dict:
    """What compare.html needs before any API answer: the runs, and the charts in the
    order drawn (so the page lays out its chart cards at once)."""
    return {
        "runs": runs,
        "run_ids": ",".join(str(r.pk) for r in runs),
        "metrics": analysis.chart_metrics(),
    }


@login_required
@require_GET
def page(request: HttpRequest) -> HttpResponse:
    """The page itself carries no data: compare.js reads its state from the URL and
    asks the API, so a copied link reproduces the same view."""
    try:
        runs = analysis.check_compare_access(request.user, request.GET.get("runs", ""))
        _choice(request, "x", X_AXES, "step")
        float_param(request, "target", DEFAULT_TARGET)
        float_param(request, "budget", DEFAULT_BUDGET_S)
    except ActionError as exc:
        if exc.http_status == 404:
            raise Http404(exc.message) from None
        return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain; charset=utf-8")
    return render(request, "compare/compare.html", page_context(runs))


@require_GET
@api_login_required
def api(request: HttpRequest) -> HttpResponse:
    """GET /api/compare?runs=1,2&target=0.8&budget=60&max_points=500&after_step=N
    [&series=a,b][&format=json|csv&what=all|summary|series|charts]."""
    try:
        runs = analysis.check_compare_access(request.user, request.GET.get("runs", ""))
        target = float_param(request, "target", DEFAULT_TARGET)
        budget = float_param(request, "budget", DEFAULT_BUDGET_S)
        max_points = int_param(request, "max_points", 500, lo=10, hi=100_000)
        after_step = int_param(request, "after_step", None)
        fmt = _choice(request, "format", ("json", "csv"), "json")
        what = _choice(request, "what", ("all", "summary", "series", "charts"), "all" if fmt == "json" else "summary")
        if fmt == "csv" and what in ("all", "charts"):
            raise BadParam("what", "format=csv needs what=summary or what=series")
        series = metric_names_param(request)
    except ActionError as exc:
        return refusal_response(exc)

    if what == "series":
        return _series_export(runs, fmt)
    if what == "charts":
        return JsonResponse(analysis.charts(runs, series, after_step=after_step, max_points=max_points))
    if what == "summary":
        configurations = analysis.group_runs(runs)
        figures = analysis.run_figures(runs, target=target, budget_s=budget)
        summary = analysis.summarize(configurations, figures)
        if fmt == "csv":
            return _summary_csv(summary)
        return JsonResponse(
            {
                "target": target,
                "budget_s": budget,
                "configurations": [{k: v for k, v in c.items() if k != "config"} for c in configurations],
                "figures": {str(k): v for k, v in figures.items()},
                "summary": summary,
            }
        )
    return JsonResponse(
        analysis.compare(
            runs, target=target, budget_s=budget, series=series, after_step=after_step, max_points=max_points
        )
    )


def _summary_csv(summary: dict) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["configuration", "label", "column", "better", "unit", "mean", "min", "max", "spread", "n", "best"])
    for row in summary["rows"]:
        for col in summary["columns"]:
            cell = row["cells"][col["key"]]
            writer.writerow(
                [
                    row["configuration"],
                    row["label"],
                    col["key"],
                    col["better"],
                    col["unit"],
                    *("" if cell[k] is None else repr(cell[k]) for k in ("mean", "min", "max", "spread")),
                    cell["n"],
                    int(row["configuration"] in summary["best"][col["key"]]),
                ]
            )
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="compare-summary.csv"'
    return response


SERIES_HEADER = ["run", "configuration", "seed", "series", "step", "wall_s", "samples", "value"]


def _series_rows(runs):
    """Every stored point of the runs (not downsampled), with its three x values."""
    configurations = analysis.group_runs(runs)
    config_of = {r: c["id"] for c in configurations for r in c["runs"]}
    figures = analysis.run_figures(runs, target=DEFAULT_TARGET, budget_s=DEFAULT_BUDGET_S)
    for run in runs:
        t0 = figures[run.pk]["t0"] or 0.0
        per_step = analysis.samples_per_step(run)
        seed = (run.config or {}).get("seed")
        points = MetricPoint.objects.filter(run=run).order_by("series", "step")
        for series, step, value, t in points.values_list("series", "step", "value", "time").iterator(chunk_size=10000):
            yield [run.pk, config_of[run.pk], seed, series, step, t - t0, step * per_step, value]


def _series_export(runs, fmt: str) -> StreamingHttpResponse:
    if fmt == "csv":

        class Echo:
            def write(self, value):
                return value

        writer = csv.writer(Echo())
        lines = (writer.writerow(row) for row in _with_header(_series_rows(runs)))
        response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="compare-series.csv"'
        return response

    def chunks():
        yield '{"columns": ' + json.dumps(SERIES_HEADER) + ', "rows": ['
        for i, row in enumerate(_series_rows(runs)):
            yield ("," if i else "") + json.dumps(row)
        yield "]}"

    return StreamingHttpResponse(chunks(), content_type="application/json")


def _with_header(rows):
    yield SERIES_HEADER
    yield from rows


# --- comparison experiments --------------------------------------------------------------


@login_required
@require_GET
def comparisons(request: HttpRequest) -> HttpResponse:
    found = Comparison.objects.visible_to(request.user).select_related("team", "created_by")
    return render(request, "compare/comparisons.html", {"comparisons": found})


def _form_choices(user) -> dict:
    teams = list(Team.objects.for_user(user).order_by("name"))
    experiments = Experiment.objects.filter(team__in=teams).select_related("team").order_by("team__name", "name")
    # "team:<id>": the team's "default" experiment, made on launch (as the launch form does)
    targets = [(f"team:{t.pk}", f"{t.name} / default") for t in teams]
    targets += [(str(e.pk), f"{e.team.name} / {e.name}") for e in experiments]
    saved = SavedConfig.objects.visible_to(user).latest_versions().select_related("team").order_by("team__name", "name")
    configurations = [(name, name, "built-in preset") for name in PRESETS]
    configurations += [(f"{SAVED_PREFIX}{c.pk}", c.label, f"saved in {c.team.name}") for c in saved]
    return {"targets": targets, "configuration_choices": configurations}


@login_required
@require_http_methods(["GET", "POST"])
def comparison_new(request: HttpRequest) -> HttpResponse:
    """The new-comparison form. On any error nothing is launched and the form comes back
    with each message next to its field."""
    form = {
        "target": request.POST.get("target", ""),
        "name": request.POST.get("name", ""),
        "description": request.POST.get("description", ""),
        "configurations": request.POST.getlist("configurations"),
        "seeds": request.POST.get("seeds", "0,1,2"),
        "overrides": request.POST.get("overrides", "{}"),
        "priority": request.POST.get("priority", "0"),
    }
    errors: dict[str, str] = nul_errors(form) if request.method == "POST" else {}
    status = 400  # a refusal's own (403: the role does not allow it)
    if request.method == "POST" and not errors:
        experiment, _, team = form["target"].partition("team:")
        try:
            overrides = jsonin.loads(form["overrides"] or "{}")
        except jsonin.BadJSON as exc:
            errors["overrides"] = str(exc)
        else:
            try:
                launch = actions.check_comparison(
                    request.user,
                    team=team,
                    experiment=experiment,
                    name=form["name"],
                    description=form["description"],
                    configurations=form["configurations"],
                    seeds=form["seeds"],
                    overrides=overrides,
                    priority=form["priority"],
                )
            except ActionError as exc:
                errors, status = exc.errors, exc.http_status
            else:
                comparison = actions.do_launch_comparison(request.user, launch)
                messages.success(request, f"Queued {comparison.members.count()} runs.")
                return redirect(comparison)
    known = {"target", "team", "experiment", "name", "description", "configurations", "seeds", "overrides", "priority"}
    context = {
        "form": form,
        "errors": errors,
        "field_errors": {k: v for k, v in errors.items() if k in known},
        "other_errors": sorted((k, v) for k, v in errors.items() if k not in known),
        "priority_range": (PRIORITY_MIN, PRIORITY_MAX),
        **_form_choices(request.user),
    }
    return render(request, "compare/comparison_new.html", context, status=status if errors else 200)


def _comparison_or_404(request: HttpRequest, comparison_id: int) -> Comparison:
    """The comparison, if it is one of the user's teams'; a 404 page otherwise."""
    try:
        return actions.check_comparison_access(request.user, comparison_id)
    except ActionError as exc:
        raise Http404(exc.message) from None


@login_required
@require_GET
def comparison(request: HttpRequest, comparison_id: int) -> HttpResponse:
    """The compare page of the comparison's runs, with its "Run again" button."""
    found = _comparison_or_404(request, comparison_id)
    runs = list(found.runs.select_related("experiment__team").order_by("pk"))
    return render(request, "compare/compare.html", {**page_context(runs), "comparison": found})


@login_required
@require_POST
def comparison_rerun(request: HttpRequest, comparison_id: int) -> HttpResponse:
    found = _comparison_or_404(request, comparison_id)
    try:
        rerun = actions.check_rerun(request.user, found, seeds=request.POST.get("seeds", "").strip() or None)
    except ActionError as exc:
        messages.error(request, f"Nothing was launched: {exc.message}")
    else:
        runs = actions.do_rerun_comparison(request.user, found, rerun)
        messages.success(request, f"Queued {len(runs)} more runs; the earlier ones stay.")
    return redirect(found)


# --- the league table ---------------------------------------------------------------------


@login_required
@require_GET
def comparison_league(request: HttpRequest, comparison_id: int) -> HttpResponse:
    """The comparison's league table: one row per configuration, sortable by any column
    (league.js), each cell a link to the runs behind it."""
    try:
        found = actions.check_comparison_access(request.user, comparison_id)
        target = float_param(request, "target", DEFAULT_TARGET)
    except ActionError as exc:
        if exc.http_status == 404:
            raise Http404(exc.message) from None
        return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain; charset=utf-8")
    table = league.table(found, target=target)
    columns = table["columns"]
    rows = [
        {
            **row,
            "shown": [
                {
                    "key": col["key"],
                    "text": row["cells"][col["key"]]["text"],
                    "sort": row["cells"][col["key"]]["value"],
                    "url": row["cells"][col["key"]]["url"],
                    "best": row["configuration"] in table["best"][col["key"]],
                }
                for col in columns
            ],
        }
        for row in table["rows"]
    ]
    context = {"comparison": found, "league": table, "columns": columns, "rows": rows, "target": target}
    return render(request, "compare/league.html", context)


@login_required
@require_POST
def comparison_league_simulate(request: HttpRequest, comparison_id: int) -> HttpResponse:
    found = _comparison_or_404(request, comparison_id)
    try:
        made, errors = league.simulate_all(request.user, found)
    except ActionError as exc:
        messages.error(request, f"Nothing was simulated: {exc.message}")
    else:
        messages.success(request, f"Simulated {len(made)} runs at {len(league.SCALES)} scales.")
        for cell, why in errors.items():
            messages.error(request, f"{cell}: {why}")
    return redirect("compare:comparison-league", comparison_id=found.pk)
