"""Comparing runs: grouping by configuration, seed bands, the summary table.

Runs with the same preset and overrides apart from `seed` are one configuration; its
runs are seeds. Charts draw each configuration's mean over seeds with a min–max band;
the summary gives, per configuration, the mean and spread over seeds of per-run
figures that account for every stored point (not for the downsampled chart series, so
a number never depends on the chart's resolution), read from the runs' rollups
(runs/rollups.py) so that 50 runs of 100k points cost a few hundred rows.

Definitions (docs/comparing.md repeats them):
- t0 of a run: the time of its first stored point, any series; wall time = time − t0.
- samples seen at step s: s × trainer.batch_groups × trainer.group_size.
- time to target: the wall time of the first reward/mean point (by step) at which the
  mean of the last 5 points (5 points needed) is ≥ target.
- reward at budget: reward/mean at the last point with wall time ≤ budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from statistics import fmean

from foundation.errors import ActionError, NotFound
from runs import rollups
from runs.metrics import bucket_band, read_many
from runs.models import Run
from workers.core.merge import dotted
from workers.core.metric_names import METRICS, rank_series

MAX_RUNS = 100
REWARD = "reward/mean"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    unit: str
    better: str  # "higher", "lower" or "closer to 1": which configuration's mean is marked best
    help: str

    def distance(self, mean: float) -> float:
        """How far `mean` is from the best: the configuration with the least is marked."""
        return {"higher": -mean, "lower": mean, "closer to 1": abs(mean - 1.0)}[self.better]


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("samples_per_s", "samples/s", "samples/s", "higher", "mean of samples/per_s"),
    Column("tokens_per_s", "tokens/s", "tok/s", "higher", "mean of inference/tokens_per_s"),
    Column("time_to_target_s", "time to target", "s", "lower", "first wall time the 5-point mean reward ≥ target"),
    Column("reward_at_budget", "reward at budget", "reward", "higher", "reward/mean at the last point ≤ budget"),
    Column("trainer_busy", "trainer busy", "fraction", "higher", "1 − mean of trainer/idle_frac"),
    Column("inference_busy", "inference busy", "fraction", "higher", "1 − mean of inference/idle_frac"),
    Column("staleness_mean", "staleness mean", "versions", "lower", "mean of staleness/mean"),
    Column("staleness_max", "staleness max", "versions", "lower", "max of staleness/max"),
    Column("dropped_frac", "dropped", "fraction", "lower", "buffer/dropped_stale × group_size / samples seen"),
    Column("requeued_frac", "requeued", "fraction", "lower", "buffer/requeued × group_size / samples seen"),
    Column("aborted_frac", "aborted", "fraction", "lower", "rollout/partial_aborted / samples seen"),
    # A multi-agent task's episodes: the tail a step waits on, and the late groups trained.
    Column("episode_p90_s", "episode p90", "s", "lower", "mean of episode/p90_s"),
    Column("late_per_step", "late groups/step", "groups", "lower", "buffer/late_groups / steps"),
    Column("sync_latency_ms", "sync latency", "ms", "lower", "mean of sync/latency_ms"),
    Column("sync_bytes", "sync bytes", "bytes", "lower", "mean of sync/bytes"),
    # A trainer pool's ranks (runs with trainer.backend ddp or fsdp2).
    Column("rank_busy_min", "least busy rank", "fraction", "higher", "min over ranks of mean trainer/rank_busy_frac"),
    Column(
        "rank_comm_share",
        "rank comm share",
        "fraction",
        "lower",
        "mean over ranks of trainer/rank_comm_s ÷ (trainer/rank_comm_s + trainer/rank_compute_s)",
    ),
    Column("rank_comm_bytes", "rank bytes/step", "bytes", "lower", "mean over ranks of trainer/rank_comm_bytes"),
    # The behaviour-trainer mismatch: what correction.keep_routing / keep_sampling_mask change.
    Column("mismatch_kl", "mismatch KL", "nats", "lower", "mean of mismatch/kl"),
    Column("is_ratio_mean", "IS ratio mean", "", "closer to 1", "mean of is/ratio_mean"),
    Column("is_clipped_frac", "IS clipped", "fraction", "lower", "mean of is/clipped_frac"),
    Column("routing_agreement", "routing agreement", "fraction", "higher", "mean of routing/agreement"),
)


# --- which runs ------------------------------------------------------------------------


def parse_run_ids(raw: str) -> list[int]:
    """The ids in `runs=1,2,3` (order kept, repeats dropped), or ActionError on `runs`."""
    ids: list[int] = []
    for part in (raw or "").replace(" ", ",").split(","):
        if not part:
            continue
        try:
            run_id = int(part)
        except ValueError:
            raise ActionError({"runs": f"runs must be comma-separated run ids (got {part!r})"}) from None
        if not 0 < run_id < 2**63:  # what a database id can be
            raise ActionError({"runs": f"a run id is a positive integer below 2^63 (got {part!r})"})
        if run_id not in ids:
            ids.append(run_id)
    if not ids:
        raise ActionError({"runs": "name the runs to compare, e.g. ?runs=12,13,14"})
    if len(ids) > MAX_RUNS:
        raise ActionError({"runs": f"compare at most {MAX_RUNS} runs at once (got {len(ids)})"})
    return ids


def check_compare_access(user, raw: str) -> list[Run]:
    """The runs named in `raw`, in that order, if `user` may see every one; NotFound
    naming the first that is unknown or in another team (outsiders learn nothing)."""
    ids = parse_run_ids(raw)
    found = {r.pk: r for r in Run.objects.visible_to(user).filter(pk__in=ids).select_related("experiment__team")}
    for run_id in ids:
        if run_id not in found:
            raise NotFound({"runs": f"run {run_id} not found"})
    return [found[run_id] for run_id in ids]


# --- configurations --------------------------------------------------------------------


def config_key(run: Run) -> str:
    """Runs of one key are seeds of one configuration. A simulated run is never a seed of
    a real one: its numbers come from cost models, not from the GPUs."""
    overrides = {k: v for k, v in dotted(run.overrides or {}).items() if k != "seed"}
    key: dict = {"preset": run.preset, "overrides": overrides}
    if run.simulated:
        key["simulated"] = run.simulation.get("cluster", True)
    return json.dumps(key, sort_keys=True, default=str)


def samples_per_step(run: Run) -> int:
    trainer = (run.config or {}).get("trainer", {})
    return int(trainer.get("batch_groups", 0)) * int(trainer.get("group_size", 0))


def group_runs(runs: list[Run]) -> list[dict]:
    """Configurations in order of first appearance: {"id", "label", "preset",
    "overrides", "runs": [run ids], "seeds": [seed per run], "config": flat config}."""
    groups: dict[str, dict] = {}
    for run in runs:
        key = config_key(run)
        if key not in groups:
            overrides = {k: v for k, v in dotted(run.overrides or {}).items() if k != "seed"}
            changed = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in sorted(overrides.items()))
            groups[key] = {
                "id": f"c{len(groups) + 1}",
                "label": run.preset + (f" ({changed})" if changed else "") + (" [simulated]" if run.simulated else ""),
                "simulated": run.simulated,
                "preset": run.preset,
                "overrides": overrides,
                "runs": [],
                "seeds": [],
                "config": {"preset": run.preset, **{k: v for k, v in dotted(run.config).items() if k != "seed"}},
            }
        groups[key]["runs"].append(run.pk)
        groups[key]["seeds"].append((run.config or {}).get("seed"))
    return list(groups.values())


def config_table(configurations: list[dict]) -> list[dict]:
    """Rows {"key", "values": [one per configuration], "differs"} over every key any
    configuration has (seed excluded: it is what varies inside one)."""
    keys = sorted({k for c in configurations for k in c["config"]})
    keys.remove("preset")
    rows = []
    for key in ["preset", *keys]:
        values = [c["config"].get(key) for c in configurations]
        encoded = {json.dumps(v, sort_keys=True, default=str) for v in values}
        rows.append({"key": key, "values": values, "differs": len(encoded) > 1})
    return rows


# --- per-run figures, in the database ----------------------------------------------------


def start_times(ids: list[int], stats: dict[int, dict[str, rollups.Agg]]) -> dict[int, float | None]:
    """{run id: t0, the time of its first stored point in any series (None without
    points)}, from its series' totals {run id: {series: aggregate}}."""
    return {r: min((a.min_time for a in stats.get(r, {}).values()), default=None) for r in ids}


def totals_by_run(ids: list[int]) -> dict[int, dict[str, rollups.Agg]]:
    stats: dict[int, dict[str, rollups.Agg]] = {r: {} for r in ids}
    for (run_id, series), agg in rollups.totals(ids).items():
        stats[run_id][series] = agg
    return stats


def run_figures(runs: list[Run], *, target: float, budget_s: float) -> dict[int, dict]:
    """{run_id: {column key: value or None, "t0": ..., "last_step": ..., "samples": ...}},
    from the runs' rollups (runs/rollups.py): a few rows per series, whatever their length."""
    ids = [r.pk for r in runs]
    stats = totals_by_run(ids)
    t0 = start_times(ids, stats)
    reached = rollups.first_reach(ids, REWARD, target)
    at_budget = rollups.last_at_or_before(REWARD, {r: t0[r] + float(budget_s) for r in ids if t0[r] is not None})

    out: dict[int, dict] = {}
    for run in runs:
        s = stats[run.pk]

        def avg(name: str, s=s):
            return s[name].mean if name in s else None

        last_step = max((a.last_step for a in s.values()), default=0)
        samples = last_step * samples_per_step(run)
        group_size = int((run.config or {}).get("trainer", {}).get("group_size", 0))

        def frac(name: str, per: int, s=s, samples=samples):
            if name not in s or samples <= 0:
                return None
            return s[name].last_value * per / samples

        busy = {k: (1.0 - avg(k)) if avg(k) is not None else None for k in ("trainer/idle_frac", "inference/idle_frac")}
        out[run.pk] = {
            "t0": t0[run.pk],
            "last_step": last_step,
            "samples": samples,
            "samples_per_s": avg("samples/per_s"),
            "tokens_per_s": avg("inference/tokens_per_s"),
            "time_to_target_s": reached[run.pk][1] - t0[run.pk] if run.pk in reached else None,
            "reward_at_budget": at_budget[run.pk][1] if run.pk in at_budget else None,
            "trainer_busy": busy["trainer/idle_frac"],
            "inference_busy": busy["inference/idle_frac"],
            "staleness_mean": avg("staleness/mean"),
            "staleness_max": s["staleness/max"].hi if "staleness/max" in s else None,
            "dropped_frac": frac("buffer/dropped_stale", group_size),
            "requeued_frac": frac("buffer/requeued", group_size),
            "aborted_frac": frac("rollout/partial_aborted", 1),
            "episode_p90_s": avg("episode/p90_s"),
            "late_per_step": s["buffer/late_groups"].last_value / last_step
            if "buffer/late_groups" in s and last_step
            else None,
            "sync_latency_ms": avg("sync/latency_ms"),
            "sync_bytes": avg("sync/bytes"),
            "mismatch_kl": avg("mismatch/kl"),
            "is_ratio_mean": avg("is/ratio_mean"),
            "is_clipped_frac": avg("is/clipped_frac"),
            "routing_agreement": avg("routing/agreement"),
            **_rank_figures(avg, s),
        }
    return out


def _rank_figures(avg, stats: dict) -> dict:
    """The trainer pool's figures of one run (all None without a pool): its least busy
    rank, and over its ranks the mean communication share and bytes per step."""
    ranks = sorted(int(name.rpartition("/")[2]) for name in stats if name.startswith("trainer/rank_busy_frac/"))
    busy = [b for r in ranks if (b := avg(rank_series("trainer/rank_busy_frac", r))) is not None]
    shares, moved = [], []
    for r in ranks:
        comm, compute = avg(rank_series("trainer/rank_comm_s", r)), avg(rank_series("trainer/rank_compute_s", r))
        if comm is not None and compute is not None and comm + compute > 0:
            shares.append(comm / (comm + compute))
        if (b := avg(rank_series("trainer/rank_comm_bytes", r))) is not None:
            moved.append(b)
    return {
        "rank_busy_min": min(busy) if busy else None,
        "rank_comm_share": fmean(shares) if shares else None,
        "rank_comm_bytes": fmean(moved) if moved else None,
    }


def summarize(configurations: list[dict], figures: dict[int, dict]) -> dict:
    """{"columns": [...], "rows": [{"configuration", "cells": {key: {mean, min, max,
    spread, n}}}], "best": {key: [configuration ids]}}; spread is half the min–max range
    over seeds (the chart's band), n how many seeds had the figure."""
    rows = []
    for c in configurations:
        cells = {}
        for col in SUMMARY_COLUMNS:
            values = [figures[r][col.key] for r in c["runs"] if figures[r][col.key] is not None]
            if values:
                lo, hi = min(values), max(values)
                spread = (hi - lo) / 2
                cells[col.key] = {"mean": fmean(values), "min": lo, "max": hi, "spread": spread, "n": len(values)}
            else:
                cells[col.key] = {"mean": None, "min": None, "max": None, "spread": None, "n": 0}
        rows.append({"configuration": c["id"], "label": c["label"], "cells": cells})
    best: dict[str, list[str]] = {}
    for col in SUMMARY_COLUMNS:
        means = [(r["cells"][col.key]["mean"], r["configuration"]) for r in rows]
        means = [(m, cid) for m, cid in means if m is not None]
        if len(means) < 2:
            best[col.key] = []
            continue
        top = min(col.distance(m) for m, _ in means)
        best[col.key] = [cid for m, cid in means if col.distance(m) == top]
    return {
        "columns": [col.__dict__ for col in SUMMARY_COLUMNS],
        "rows": rows,
        "best": best,
    }


# --- chart series ---

# The charts a comparison is read by come first (the page loads charts as they come into
# view); then the rest of the vocabulary in its own order.
HEADLINE = ("reward/mean", "samples/per_s", "trainer/idle_frac", "inference/idle_frac", "staleness/mean")


def chart_metrics() -> list[dict]:
    """The vocabulary in the order the page draws its charts: {"name", "unit", "help"}."""
    # A per-rank metric is a series per rank: the pool's figures are in the table instead.
    charted = [m for m in METRICS if not m.per_rank]
    first = [m for name in HEADLINE for m in charted if m.name == name]
    ordered = first + [m for m in charted if m.name not in HEADLINE]
    return [{"name": m.name, "unit": m.unit, "help": m.help} for m in ordered]


def seed_band(per_run: list[dict]) -> dict:
    """Mean, min and max over seeds at every step any seed has, each seed holding its
    last value until its next point (a seed contributes from its first point on):
    {"steps", "mean", "min", "max", "wall"} (wall: mean wall time over those seeds)."""
    steps = sorted({s for r in per_run for s in r["steps"]})
    cursors = [0] * len(per_run)
    out = {"steps": [], "mean": [], "min": [], "max": [], "wall": []}
    for step in steps:
        values, walls = [], []
        for i, r in enumerate(per_run):
            j = cursors[i]
            while j < len(r["steps"]) and r["steps"][j] <= step:
                j += 1
            cursors[i] = j
            if j:
                values.append(r["values"][j - 1])
                walls.append(r["wall"][j - 1])
        if not values:
            continue
        out["steps"].append(step)
        out["mean"].append(fmean(values))
        out["min"].append(min(values))
        out["max"].append(max(values))
        out["wall"].append(fmean(walls))
    return out


def chart_series(
    runs: list[Run],
    configurations: list[dict],
    start: dict[int, float | None],
    *,
    names: list[str],
    after_step=None,
    max_points: int,
) -> tuple[dict, dict]:
    """(per run {id: {series: {"steps", "values", "wall"}}}, per configuration with more
    than one seed {id: {series: band}}) for the metrics `names`, downsampled.

    A configuration's seeds are drawn as their band, so a seed's own series is read
    only where the band is made from the seeds' points (`seed_band`: every seed short
    enough to show whole, or a live read after a step); a band of longer series comes
    from the rollups (`bucket_band`) and its runs carry no series of their own there."""
    if not names:
        return {r.pk: {} for r in runs}, {}
    ids = [r.pk for r in runs]
    t0 = {r.pk: start.get(r.pk) or 0.0 for r in runs}
    totals = rollups.totals(ids, names)
    lengths = {key: agg.n for key, agg in totals.items()}
    from_rollups: list[tuple[str, str, list[int]]] = []  # (configuration, name, its runs)
    wanted: set[tuple[int, str]] = set()
    for c in configurations:
        for name in names:
            seeds = [r for r in c["runs"] if (r, name) in lengths]
            long = any(lengths[(r, name)] > max_points for r in seeds)
            if len(c["runs"]) > 1 and long and after_step is None:
                from_rollups.append((c["id"], name, seeds))
            else:
                wanted.update((r, name) for r in seeds)
    raw = read_many(ids, names, after_step, max_points, only=wanted, totals=totals)
    per_run: dict[int, dict] = {}
    for run in runs:
        per_run[run.pk] = {
            name: {
                "steps": s["steps"],
                "values": s["values"],
                "wall": [t - t0[run.pk] for t in s["times"]],
                "total": s["total"],
                "downsampled": s["downsampled"],
            }
            for name, s in raw[run.pk].items()
        }
    bands: dict[str, dict] = {c["id"]: {} for c in configurations if len(c["runs"]) > 1}
    for c in configurations:
        if len(c["runs"]) < 2:
            continue
        for name in names:
            seeds = [per_run[r][name] for r in c["runs"] if name in per_run[r]]
            if seeds:
                bands[c["id"]][name] = seed_band(seeds)
    for cid, name, seeds in from_rollups:
        band = bucket_band(seeds, name, max_points, t0, totals)
        if band:
            bands[cid][name] = band
    return per_run, bands


def compare(
    runs: list[Run],
    *,
    target: float,
    budget_s: float,
    series: list[str] | None = None,
    after_step=None,
    max_points: int = 500,
) -> dict:
    """Everything the compare page shows, as JSON; chart series only for the metrics in
    `series` (all when None: the page asks per chart, for the charts in view)."""
    configurations = group_runs(runs)
    figures = run_figures(runs, target=target, budget_s=budget_s)
    names = [m.name for m in METRICS if not m.per_rank] if series is None else series
    t0 = {r: f["t0"] for r, f in figures.items()}
    per_run, bands = chart_series(runs, configurations, t0, names=names, after_step=after_step, max_points=max_points)
    config_of = {r: c["id"] for c in configurations for r in c["runs"]}
    return {
        "target": target,
        "budget_s": budget_s,
        "metrics": chart_metrics(),
        "runs": [
            {
                **run.summary(),
                "configuration": config_of[run.pk],
                "seed": (run.config or {}).get("seed"),
                "samples_per_step": samples_per_step(run),
                "figures": figures[run.pk],
                "series": per_run[run.pk],
            }
            for run in runs
        ],
        "configurations": [{k: v for k, v in c.items() if k != "config"} for c in configurations],
        "config_table": config_table(configurations),
        "bands": bands,
        "summary": summarize(configurations, figures),
    }


def charts(runs: list[Run], series: list[str] | None, *, after_step=None, max_points: int = 500) -> dict:
    """Only the chart series of the metrics `series` (all when None), per run and per
    configuration band: what the page asks for each chart as it comes into view."""
    configurations = group_runs(runs)
    ids = [r.pk for r in runs]
    t0 = start_times(ids, totals_by_run(ids))
    names = [m.name for m in METRICS if not m.per_rank] if series is None else series
    per_run, bands = chart_series(runs, configurations, t0, names=names, after_step=after_step, max_points=max_points)
    return {"series": {str(k): v for k, v in per_run.items()}, "bands": bands}
