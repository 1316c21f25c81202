"""The run list: filters, search, sort and pages over the runs a user may see, with the
columns a person scans for (latest reward and its sparkline, steps done, samples/s,
duration) computed by the database.

The page (dashboard `runs`) and the API (`GET /api/runs`) read the same query
parameters through `check_list_query`, so a URL copied from one works on the other:

    status=running,queued  preset=async  experiment=<id>  launcher=<username>
    created_from=YYYY-MM-DD  created_to=YYYY-MM-DD (inclusive)  q=<part of the name>
    tag=<a tag on the run>
    sort=created|name|status|steps|reward|samples_per_s|duration (prefix "-" to reverse)
    page=<1..MAX_PAGE>  page_size=<1..MAX_PAGE_SIZE>

A page costs a fixed number of queries whatever its size: a count, the page's rows with
their latest values as correlated subqueries (each an index range scan on the unique
(run, series, step) index), and one windowed query for every row's sparkline.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now

from foundation.errors import ActionError, nul_errors
from runs import rollups
from runs.models import MetricPoint, Run

DEFAULT_PAGE_SIZE = 50
# Far past any real list (a million pages); keeps the row offset inside PostgreSQL's bigint.
MAX_PAGE = 1_000_000
# The largest id a bigint holds: past it, SQLite cannot even bind the filter's value.
MAX_ID = 2**63 - 1
# A page is one request's worth of rows and sparklines: 200 keeps it a few hundred KB.
MAX_PAGE_SIZE = 200
# Points per sparkline: enough to show a trend in a table cell, few enough to stay small.
SPARK_POINTS = 50
REWARD, STEPS, SAMPLES = "reward/mean", "policy/version", "samples/per_s"

# sort key → the annotation or field it orders by
SORTS = {
    "created": "created_at",
    "name": "name",
    "status": "status",
    "steps": "steps_done",
    "reward": "latest_reward",
    "samples_per_s": "samples_per_s",
    "duration": "duration",
}


@dataclass(frozen=True)
class ListQuery:
    """A validated list request; `params()` gives it back as query parameters."""

    statuses: tuple[str, ...] = ()
    preset: str = ""
    experiment: int | None = None
    launcher: str = ""
    created_from: dt.date | None = None
    created_to: dt.date | None = None
    q: str = ""
    tag: str = ""
    sort: str = "-created"
    page: int = 1
    page_size: int = DEFAULT_PAGE_SIZE
    errors: dict[str, str] = field(default_factory=dict)

    def params(self, **changes: Any) -> dict[str, str]:
        """The non-default parameters, with `changes` applied (page=2, sort="name")."""
        values = {
            "status": ",".join(self.statuses),
            "preset": self.preset,
            "experiment": "" if self.experiment is None else str(self.experiment),
            "launcher": self.launcher,
            "created_from": self.created_from.isoformat() if self.created_from else "",
            "created_to": self.created_to.isoformat() if self.created_to else "",
            "q": self.q,
            "tag": self.tag,
            "sort": "" if self.sort == "-created" else self.sort,
            "page": "" if self.page == 1 else str(self.page),
            "page_size": "" if self.page_size == DEFAULT_PAGE_SIZE else str(self.page_size),
        }
        values.update({k: str(v) for k, v in changes.items()})
        return {k: v for k, v in values.items() if v}


def _int(raw: str, name: str, lo: int, hi: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ActionError({name: f"{name} must be an integer (got {raw!r})"}) from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"≥ {lo}"
        raise ActionError({name: f"{name} must be {bound} (got {value})"})
    return value


def _date(raw: str, name: str) -> dt.date:
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise ActionError({name: f"{name} must be a date as YYYY-MM-DD (got {raw!r})"}) from None


def check_list_query(get) -> ListQuery:
    """The list request in a QueryDict (or dict) of parameters; ActionError naming every
    bad parameter and what it accepts."""
    raw = {k: (get.get(k) or "").strip() for k in LIST_PARAMS}
    errors = nul_errors(raw)
    out: dict[str, Any] = {"q": raw["q"], "preset": raw["preset"], "launcher": raw["launcher"], "tag": raw["tag"]}
    checks = {
        "status": lambda v: tuple(s for s in v.split(",") if s),
        "experiment": lambda v: _int(v, "experiment", 1, MAX_ID),
        "created_from": lambda v: _date(v, "created_from"),
        "created_to": lambda v: _date(v, "created_to"),
        "page": lambda v: _int(v, "page", 1, MAX_PAGE),
        "page_size": lambda v: _int(v, "page_size", 1, MAX_PAGE_SIZE),
    }
    for name, check in checks.items():
        if raw[name]:
            try:
                out[name] = check(raw[name])
            except ActionError as exc:
                errors.update(exc.errors)
    if "status" in out:
        unknown = [s for s in out.pop("status") if s not in Run.Status.values]
        if unknown:
            errors["status"] = f"unknown status {', '.join(unknown)}: use {', '.join(Run.Status.values)}"
        else:
            out["statuses"] = tuple(s for s in raw["status"].split(",") if s)
    if raw["sort"]:
        if raw["sort"].lstrip("-") not in SORTS:
            errors["sort"] = f"sort by one of {', '.join(SORTS)} (prefix - to reverse; got {raw['sort']!r})"
        else:
            out["sort"] = raw["sort"]
    if errors:
        raise ActionError(errors)
    return ListQuery(**out)


LIST_PARAMS = (
    "status",
    "preset",
    "experiment",
    "launcher",
    "created_from",
    "created_to",
    "q",
    "tag",
    "sort",
    "page",
    "page_size",
)


def _latest(series: str) -> Subquery:
    return Subquery(MetricPoint.objects.filter(run=OuterRef("pk"), series=series).order_by("-step").values("value")[:1])


def annotated(runs: QuerySet[Run]) -> QuerySet[Run]:
    """`runs` with latest_reward, steps_done, samples_per_s and duration (started to
    finished, or to now while running; None before the driver reported in)."""
    return runs.annotate(
        latest_reward=_latest(REWARD),
        steps_done=_latest(STEPS),
        samples_per_s=_latest(SAMPLES),
        duration=ExpressionWrapper(Coalesce(F("finished_at"), Now()) - F("started_at"), output_field=DurationField()),
    )


def filtered(runs: QuerySet[Run], query: ListQuery) -> QuerySet[Run]:
    if query.statuses:
        runs = runs.filter(status__in=query.statuses)
    if query.preset:
        runs = runs.filter(preset=query.preset)
    if query.experiment is not None:
        runs = runs.filter(experiment_id=query.experiment)
    if query.launcher:
        runs = runs.filter(launched_by__username=query.launcher)
    if query.created_from:
        runs = runs.filter(created_at__date__gte=query.created_from)
    if query.created_to:
        runs = runs.filter(created_at__date__lte=query.created_to)
    if query.q:
        runs = runs.filter(name__icontains=query.q)
    if query.tag:
        runs = runs.filter(tags__name=query.tag)
    return runs


def ordered(runs: QuerySet[Run], sort: str) -> QuerySet[Run]:
    """Sorted by `sort`; runs without the value (no points yet) last either way, and
    newest first among equals so pages are stable."""
    desc = sort.startswith("-")
    key = F(SORTS[sort.lstrip("-")])
    key = key.desc(nulls_last=True) if desc else key.asc(nulls_last=True)
    return runs.order_by(key, "-created_at", "-id")


@dataclass
class Page:
    runs: list[Run]
    total: int
    query: ListQuery

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.page_size))

    @property
    def has_next(self) -> bool:
        return self.query.page < self.pages

    @property
    def has_prev(self) -> bool:
        return self.query.page > 1


def list_runs(user, query: ListQuery) -> Page:
    """One page of the runs `user` may see, each with its annotations and `sparkline`
    (the last SPARK_POINTS reward/mean values, oldest first)."""
    runs = filtered(Run.objects.visible_to(user), query)
    total = runs.count()
    start = (query.page - 1) * query.page_size
    rows = list(
        ordered(annotated(runs), query.sort)
        .select_related("experiment__team", "launched_by")
        .prefetch_related("tags")[start : start + query.page_size]
    )
    sparks = sparklines([r.pk for r in rows])
    for r in rows:
        r.sparkline = sparks.get(r.pk, [])
    return Page(runs=rows, total=total, query=query)


def sparklines(run_ids: list[int], points: int = SPARK_POINTS) -> dict[int, list[float]]:
    """{run id: the last `points` reward/mean values, oldest first}, in a few queries
    whatever the runs' lengths. A window query ranking every stored point costs seconds
    for a page of long runs; instead the rollups say where each series ends, and a series
    with a point at every step (the reward is reported each step) has its last `points`
    values at the last `points` steps. Any other is read backwards on its own."""
    totals = rollups.totals(run_ids, [REWARD])
    first: dict[int, int] = {}
    gappy: list[int] = []
    for (run_id, _), agg in totals.items():
        if agg.n == agg.last_step - agg.first_step + 1:
            first[run_id] = agg.last_step - points + 1
        else:
            gappy.append(run_id)
    found: dict[int, list[float]] = defaultdict(list)
    chunk = rollups.MAX_TERMS
    ends = list(first.items())
    for start in range(0, len(ends), chunk):
        where = Q()
        for run_id, step in ends[start : start + chunk]:
            where |= Q(run_id=run_id, step__gte=step)
        rows = MetricPoint.objects.filter(where, series=REWARD).order_by("run_id", "step")
        for run_id, value in rows.values_list("run_id", "value"):
            found[run_id].append(value)
    for run_id in gappy:
        values = (
            MetricPoint.objects.filter(run_id=run_id, series=REWARD).order_by("-step").values_list("value", flat=True)
        )
        found[run_id] = list(values[:points])[::-1]
    return dict(found)


def sparkline_path(values: list[float], width: int = 100, height: int = 24) -> str:
    """An SVG polyline's points for `values`, scaled to fill width × height (higher is
    up). Drawn on the server: a table of 200 runs needs no chart library."""
    if len(values) < 2:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    dx = width / (len(values) - 1)
    return " ".join(f"{i * dx:.1f},{height - (v - lo) / span * height:.1f}" for i, v in enumerate(values))


def progress(run: Run, steps_done: float | None, elapsed_s: float | None) -> tuple[float | None, float | None]:
    """(fraction 0..1, seconds left) toward the run's stop condition: steps toward
    stop.max_steps or time toward stop.max_minutes, whichever comes first. The time left
    assumes the mean step rate so far; the run page refines both from recent steps.
    (None, None) while nothing says (no steps yet, no config)."""
    stop = (run.config or {}).get("stop") or {}
    if not steps_done or not elapsed_s:
        return None, None
    fractions, left = [], []
    if stop.get("max_steps"):
        fractions.append(steps_done / stop["max_steps"])
        left.append(max(0.0, stop["max_steps"] - steps_done) * elapsed_s / steps_done)
    if stop.get("max_minutes"):
        fractions.append(elapsed_s / (stop["max_minutes"] * 60))
        left.append(max(0.0, stop["max_minutes"] * 60 - elapsed_s))
    if not fractions:
        return None, None
    return min(1.0, max(fractions)), min(left)


def row(run: Run) -> dict:
    """What the list shows for a run (annotated by `list_runs`), as JSON."""
    duration = run.duration.total_seconds() if run.duration is not None else None
    fraction, eta = progress(run, run.steps_done, duration) if run.status == Run.Status.RUNNING else (None, None)
    return {
        **run.summary(),
        "launched_by": run.launched_by.get_username() if run.launched_by else None,
        "latest_reward": run.latest_reward,
        "steps_done": int(run.steps_done) if run.steps_done is not None else None,
        "samples_per_s": run.samples_per_s,
        "duration_s": duration,
        "progress": fraction,
        "eta_s": eta,
        "sparkline": run.sparkline,
    }
