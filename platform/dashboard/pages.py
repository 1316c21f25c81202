"""What the run list and a run's page show, for the views to render: the list's sortable
columns and filter choices, the run page's charts and what the reader may do there."""

from __future__ import annotations

import datetime as dt
import json
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.utils.text import slugify

from foundation.errors import ActionError, NotFound
from runs import lineage, listing, logs, sinks
from runs.models import Experiment, Run
from teams import roles
from teams.models import Team
from workers.config.presets import PRESETS
from workers.core.metric_names import (
    DASHBOARD_CHARTS,
    PER_RANK,
    agent_series,
    metric_of,
    rank_series,
    reward_func_series,
)
from workers.rl_tasks import task_class

# Tags the flash that says a new run is queued (launch, retry, resume): once the run has
# ended that is no longer true, so a finished run's page leaves it out, and run.js drops
# it when the run ends under the reader's eyes.
UNTIL_RUN_ENDS = "until-run-ends"
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


def run_list(request: HttpRequest) -> tuple[dict, int]:
    """The run list's context: filters, search, sort and page from the URL
    (runs/listing.py); and its status, 400 for a query it could not read (the list is
    then shown unfiltered, with the errors)."""
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
    teams = Team.objects.for_user(request.user)
    context = {
        "page": page,
        "runs": page.runs,
        "query": query,
        "errors": errors,
        "columns": _columns(query),
        "statuses": Run.Status.values,
        "presets": sorted(PRESETS),
        "experiments": Experiment.objects.visible_to(request.user).select_related("team"),
        "launchers": sorted(
            get_user_model().objects.filter(memberships__team__in=teams).values_list("username", flat=True).distinct()
        ),
        "next_url": "?" + urlencode(query.params(page=query.page + 1)) if page.has_next else "",
        "prev_url": "?" + urlencode(query.params(page=query.page - 1)) if page.has_prev else "",
        "here": request.get_full_path(),
        "has_team": teams.exists(),
    }
    return context, 400 if errors else 200


def _columns(query: listing.ListQuery) -> list[dict]:
    key = query.sort.lstrip("-")
    return [
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


def _next_sort(key: str, current: str) -> str:
    if current.lstrip("-") == key:
        return key if current.startswith("-") else f"-{key}"
    return key if key == "name" else f"-{key}"


# How the line under a finished run's charts says it ended; run.js says the same when the
# run ends with its page open.
ENDED_AS = {Run.Status.SUCCEEDED: "succeeded", Run.Status.FAILED: "failed", Run.Status.CANCELLED: "was cancelled"}


def final_note(run: Run) -> str:
    """ "final — the run succeeded at 2026-11-25 09:40 UTC" for a finished run, else ""
    (its page is live)."""
    if not run.is_terminal:
        return ""
    at = f" at {run.finished_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC" if run.finished_at else ""
    return f"final — the run {ENDED_AS[run.status]}{at}"


def run_page(request: HttpRequest, run: Run) -> dict:
    """A run's page (a run the reader may see): what it may do there, the run's
    checkpoints, lineage and config, its charts and the flashes still true of it."""
    user = request.user
    role = roles.role_of(user, run.experiment.team)
    return {
        "run": run,
        "may_cancel": roles.may_cancel(user, run),
        "may_export": roles.allows(role, "export models"),
        "may_launch": roles.allows(role, "launch runs"),
        "may_annotate": roles.allows(role, roles.annotate_action(user, run)),
        "checkpoints": run.checkpoints.order_by("-step"),
        # Only a run that could be replayed gets the button (runs/lineage.py says why not).
        "replayable": run.status == Run.Status.SUCCEEDED and not lineage.replay_refusal(run),
        "children": run.team_children(),
        "tags_text": " ".join(run.tag_names()),
        "config_json": json.dumps(run.config, indent=2),
        "overrides_json": json.dumps(run.overrides, indent=2),
        "charts": _charts(run),
        "placement": _placement(run),
        "ledger": _ledger(run),
        "replay": _replay(run),
        "final_note": final_note(run),
        # The trackers the run goes to (None: the site has none, so nothing is said).
        "trackers": [s.NAME for s in sinks.for_run(run.trackers)] if sinks.configured() else None,
        "messages": [m for m in messages.get_messages(request) if not run.is_terminal or UNTIL_RUN_ENDS not in m.tags],
    }


def run_log_page(run: Run) -> tuple[dict, int]:
    """A run's driver log page (a run the reader may see): the log's end, or why there
    is no log here (with status 404)."""
    try:
        path = logs.log_file(run)
    except NotFound as exc:
        return {"run": run, "missing": exc.errors["run"]}, 404
    shown = logs.tail(path)
    return {
        "run": run,
        "log": shown,
        "shown_bytes": shown["size"] - shown["offset"],
        "tail_bytes": logs.TAIL_BYTES,
    }, 200


# Series a run's config can turn off: (name prefix, whether this config turns them off,
# what the chart says instead of "waiting for data").
_OFF_BY_CONFIG = (
    ("eval/", lambda config: not (config.get("eval") or {}).get("every_steps"), "eval is off for this run"),
    (
        "routing/",
        lambda config: not (config.get("correction") or {}).get("keep_routing"),
        "routing replay (correction.keep_routing) is off for this run",
    ),
    (
        "trainer/mfu",
        lambda config: (config.get("placement") or {}).get("devices", "cpu") != "gpu",
        "the trainer computes on the CPU, which has no peak to measure MFU against",
    ),
)


def _empty_because(series: tuple[str, ...], config: dict) -> str:
    """Why a chart stays empty for a run whose config turns all its series off ("" if not)."""
    for prefix, off, why in _OFF_BY_CONFIG:
        if off(config) and all(s.startswith(prefix) for s in series):
            return why
    return ""


def _charts(run: Run) -> list[dict]:
    """The run page's chart cards; `empty` says why a chart will stay empty for this run
    (its pass is off in the run's config), shown in place of "waiting for data". A
    per-rank metric is drawn as one line per trainer rank, on runs with a trainer pool."""
    trainer = run.config.get("trainer") or {}
    ranks = int(trainer.get("num_ranks") or 1) if trainer.get("backend", "single") != "single" else 0
    cards = []
    for title, series in DASHBOARD_CHARTS:
        if any(name in PER_RANK for name in series):
            if not ranks:
                continue  # one trainer process: no per-rank figures
            series = tuple(rank_series(name, r) for name in series for r in range(ranks))
        cards.append(_card(title, series, run.config))
        if title == "Reward" and _reward_funcs(run.config):
            # One line per task.reward_funcs function, beside the sum they make.
            names = [path.rpartition(":")[2] for path in _reward_funcs(run.config)]
            cards.append(_card("Reward functions", tuple(reward_func_series(n, "mean") for n in names), run.config))
        agents = _agents(run.config)
        if title == "Reward" and agents:
            # A multi-agent task: each agent's reward and completion time.
            cards += [
                _card("Agents: reward", tuple(agent_series(a, "reward_mean") for a in agents), run.config),
                _card(
                    "Agents: completion time (s)",
                    tuple(agent_series(a, q) for a in agents for q in ("p50_s", "p90_s")),
                    run.config,
                ),
            ]
        if title == "Reward" and (agents or (run.config.get("buffer") or {}).get("unit") == "episode"):
            # Episodes on their own clocks: the tail a step waits on, and the groups
            # trained late (buffer.overcommit).
            cards += [
                _card("Episode completion time (s)", ("episode/p50_s", "episode/p90_s"), run.config),
                _card("Late groups (cumulative)", ("buffer/late_groups",), run.config),
            ]
    return cards


def _agents(config: dict) -> tuple[str, ...]:
    """The agents of a run's multi-agent task, in turn order (() for any other task)."""
    try:
        task = task_class(str((config.get("task") or {}).get("name") or ""))
    except ValueError:  # a task this site cannot load: its page still draws
        return ()
    return tuple(getattr(task, "agents", ())) if getattr(task, "multi_agent", False) else ()


def _reward_funcs(config: dict) -> list[str]:
    return list((config.get("task") or {}).get("reward_funcs") or [])


def _card(title: str, series: tuple[str, ...], config: dict) -> dict:
    return {
        "id": f"chart-{slugify(title)}",
        "title": title,
        "series": ",".join(series),
        "unit": _unit(series[0]),
        "empty": _empty_because(series, config),
    }


def _unit(series: str) -> str:
    metric = metric_of(series)
    return metric.unit if metric else ""


# The prompt ledger's table on a finished run's page: (total, what it counts).
LEDGER_ROWS = (
    ("drawn", "rows drawn from the data or the task"),
    ("trained", "trained"),
    ("dropped_stale", "dropped as stale"),
    ("dropped_uniform", "dropped: all rewards equal"),
    ("waiting", "left in the buffer"),
    ("requeued_waiting", "left to be generated again"),
    ("in_flight", "being generated when the run stopped"),
)


def _ledger(run: Run) -> dict | None:
    """Where every row the run drew went, as its page shows it; None before the run's
    loops stopped (or for a run that reported no ledger)."""
    totals = run.ledger()
    if not totals:
        return None
    return {
        "rows": [(label, totals.get(name, 0)) for name, label in LEDGER_ROWS],
        "unaccounted": totals.get("unaccounted", 0),
    }


def _replay(run: Run) -> dict | None:
    """A replay's comparison with its original (Run.replay_comparison) as its page shows
    it: the table's rows and one sentence saying whether, and where, the two differ."""
    compared = run.replay_comparison()
    if compared is None:
        return None
    rows, original = compared["series"], compared["original"]
    differs = [r for r in rows if r["first_differs"] is not None]
    uneven = [r for r in rows if not r["original_steps"] == r["replay_steps"] == r["compared"]]
    if differs:
        where = "; ".join(
            f"{r['series']} from step {r['first_differs']} (largest |difference| {r['largest_gap']:.3g})"
            for r in differs
        )
        verdict, equal = f"Differs from run #{original}: {where}.", False
    elif not rows:
        verdict, equal = "Neither run has a trained step yet.", not run.is_terminal
    elif uneven and not run.is_terminal:
        verdict, equal = f"Equal to run #{original} at every step both have so far.", True
    elif uneven:
        counts = "; ".join(f"{r['series']}: {r['replay_steps']} here, {r['original_steps']} there" for r in uneven)
        verdict, equal = f"Equal at every step both have, but the steps differ ({counts}).", False
    else:
        verdict, equal = f"Equal to run #{original} at every step of every trained series: bit for bit.", True
    shown = [{**r, "gap": "—" if r["largest_gap"] is None else f"{r['largest_gap']:.3g}"} for r in rows]
    return {"original": original, "rows": shown, "verdict": verdict, "equal": equal}


def _placement(run: Run) -> list[dict]:
    """Where the run's actors run, as the table on its page shows them."""
    rows = []
    for place in run.placement or []:
        labels = ", ".join(f"{k}={v}" for k, v in sorted((place.get("labels") or {}).items()))
        rows.append(
            {
                "actor": place.get("actor", ""),
                "node": place.get("node_ip", ""),
                "node_id": (place.get("node_id") or "")[:12],
                "labels": labels,
                "gpus": place.get("cuda_visible_devices") or ", ".join(place.get("gpu_ids") or []) or "none",
                "threads": place.get("threads") or "—",  # torch's, where the actor has torch loaded
            }
        )
    return rows
