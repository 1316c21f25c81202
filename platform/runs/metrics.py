"""Reading runs' series for charts, downsampled from their rollups.

A long run has 100k+ points per series; a chart needs a few hundred. Min-max decimation
keeps, per group of consecutive steps, the lowest and the highest point, so spikes
survive (an average would hide a staleness burst), plus the series' last point so a live
chart appends new steps after it.

The groups are rollup buckets (runs/rollups.py): for a long series the narrowest level
with at most FAN_OUT × the wanted number of buckets is read and consecutive buckets are
merged down to that number, so a read costs at most FAN_OUT × the chart's groups in rows
per series however many points were stored. A series short enough to show whole is read
point by point.

The run page reads every series of a run at 2,000 points each: tens of thousands of
buckets. Each is read as the six numbers its merge needs (`rollups.extremes`), one
series at a time (the read holds one series' rows, never the run's), and merged in one
pass over plain tuples: per-bucket Python objects (an `Agg` of fourteen fields, a
`rollups.merge` call per group) would cost several times the database's own work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from statistics import fmean

from runs import rollups
from runs.models import MetricPoint, Run

# Beyond any step: "no bound" on that side of a read (steps are stored as 64-bit ints).
NO_STEP = 2**62


def widest_fit(span: int, buckets: int) -> int:
    """The narrowest rollup width that cuts `span` steps into at most FAN_OUT × `buckets`
    buckets (merged down to `buckets` afterwards), or the widest there is."""
    for width in rollups.WIDTHS:
        if -(-span // width) <= rollups.FAN_OUT * buckets:
            return width
    return rollups.WIDTHS[-1]


def _by_series_set(pairs: Iterable[tuple[int, str]]) -> list[tuple[list[int], list[str]]]:
    """(runs, series) groups covering `pairs` exactly: the runs that ask for the same
    series share one query (usually all of them do)."""
    per_run: dict[int, set[str]] = defaultdict(set)
    for run_id, name in pairs:
        per_run[run_id].add(name)
    groups: dict[frozenset[str], list[int]] = defaultdict(list)
    for run_id, names in per_run.items():
        groups[frozenset(names)].append(run_id)
    return [(runs, sorted(names)) for names, runs in groups.items()]


def _raw(pairs: list[tuple[int, str]], lo: int, hi: int) -> dict[tuple[int, str], list[tuple]]:
    out: dict[tuple[int, str], list[tuple]] = defaultdict(list)
    for runs, names in _by_series_set(pairs):
        rows = (
            MetricPoint.objects.filter(run_id__in=runs, series__in=names, step__gte=lo, step__lte=hi)
            .order_by("run_id", "series", "step")
            .values_list("run_id", "series", "step", "value", "time")
        )
        for run_id, name, step, value, t in rows:
            out[(run_id, name)].append((step, value, t))
    return out


def decimate(rows: list[tuple], keep: int) -> tuple[list, list, list]:
    """(steps, values, times) of consecutive buckets' `rollups.extremes` rows merged into
    at most `keep` groups of equal count, each giving its first lowest and first highest
    point in step order (one point when they are the same)."""
    size = -(-len(rows) // keep)
    steps: list[int] = []
    values: list[float] = []
    times: list[float] = []
    for start in range(0, len(rows), size):
        lo = hi = rows[start]
        # A later bucket wins only when strictly lower (higher): ties keep the first.
        for row in rows[start + 1 : start + size]:
            if row[1] < lo[1]:
                lo = row
            if row[4] > hi[4]:
                hi = row
        lo_step, hi_step = lo[0], hi[3]
        if lo_step < hi_step:
            steps += (lo_step, hi_step)
            values += (lo[1], hi[4])
            times += (lo[2], hi[5])
        elif hi_step < lo_step:
            steps += (hi_step, lo_step)
            values += (hi[4], lo[1])
            times += (hi[5], lo[2])
        else:
            steps.append(lo_step)
            values.append(lo[1])
            times.append(lo[2])
    return steps, values, times


def _last_point(run_id: int, name: str, hi: int) -> tuple | None:
    """The series' last (step, value, time) at or before step `hi`."""
    return (
        MetricPoint.objects.filter(run_id=run_id, series=name, step__lte=hi)
        .order_by("-step")
        .values_list("step", "value", "time")
        .first()
    )


def _clamp(step: int) -> int:
    return max(-NO_STEP, min(int(step), NO_STEP))


def read_many(
    run_ids: Iterable[int],
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
    *,
    from_step: int | None = None,
    to_step: int | None = None,
    only: set[tuple[int, str]] | None = None,
    totals: dict[tuple[int, str], rollups.Agg] | None = None,
) -> dict[int, dict[str, dict]]:
    """{run_id: {name: {"steps", "values", "times", "total", "last_step", "downsampled"}}}
    for the runs' series (all, or those named; only the (run, name) pairs in `only` when
    given), each min-max downsampled to at most `max_points` points, ending with the
    last point of the steps asked for. Only steps > after_step (polling for newer
    points) and in [from_step, to_step] (a chart zoomed in) when given: the groups are
    then cut from that range alone, so a zoom shows the detail that the whole run's
    chart merged away.
    `total` counts all the series' stored points and `last_step` is where the series
    ends, whatever the range. `totals`: the runs' `rollups.totals` when the caller has
    read them."""
    run_ids = [int(r) for r in run_ids]
    out: dict[int, dict[str, dict]] = {r: {} for r in run_ids}
    if totals is None:
        totals = rollups.totals(run_ids, series)
    if only is not None:
        totals = {key: agg for key, agg in totals.items() if key in only}
    max_points = max(int(max_points), 3)
    keep = (max_points - 1) // 2
    lo = -NO_STEP if after_step is None else _clamp(after_step) + 1
    if from_step is not None:
        lo = max(lo, _clamp(from_step))
    hi = NO_STEP if to_step is None else _clamp(to_step)

    raw: list[tuple[int, str]] = []
    coarse: list[tuple[tuple[int, str], int, int]] = []  # (key, first step, last step) to read
    for key, agg in totals.items():
        first, last = max(agg.first_step, lo), min(agg.last_step, hi)
        if first > last:
            continue  # nothing in the range
        # Inside a range only its span is known: it bounds the points there (one per step).
        if min(agg.n, last - first + 1) <= max_points:
            raw.append(key)
        else:
            coarse.append((key, first, last))

    points = {key: tuple(map(list, zip(*rows, strict=True))) for key, rows in _raw(raw, lo, hi).items()}
    levels = []
    for key, first, last in coarse:
        width = widest_fit(last - first + 1, keep)
        # Unbounded above without to_step: buckets newer than the totals come too.
        levels.append((*key, width, first // width, last // width if to_step is not None else NO_STEP))
    # One series' buckets at a time, decimated before the next are read: the read's
    # memory is one series' level (up to FAN_OUT × keep rows), not the run's.
    for key, rows in rollups.extremes(levels):
        steps, values, times = decimate(rows, keep) if rows else ([], [], [])
        if steps and (steps[0] < lo or steps[-1] > hi):
            # The edge buckets of a range also hold steps outside it.
            inside = [i for i, step in enumerate(steps) if lo <= step <= hi]
            steps, values, times = ([column[i] for i in inside] for column in (steps, values, times))
        agg = totals[key]
        end = (agg.last_step, agg.last_value, agg.last_time) if hi >= agg.last_step else _last_point(*key, hi)
        # The last point in the range ends the line, unless the buckets brought a newer
        # one (stored since the totals were read).
        if end is not None and end[0] >= lo and (not steps or steps[-1] < end[0]):
            steps.append(end[0])
            values.append(end[1])
            times.append(end[2])
        points[key] = (steps, values, times)

    for (run_id, name), agg in totals.items():
        kept = points.get((run_id, name))
        if kept and kept[0]:
            steps, values, times = kept
            out[run_id][name] = {
                "steps": steps,
                "values": values,
                "times": times,
                "total": agg.n,
                # The points and the totals are two reads: a point stored between them
                # is in `steps` but newer than the totals say.
                "last_step": max(agg.last_step, steps[-1]),
                "downsampled": (run_id, name) not in raw,
            }
    return out


def bucket_band(
    run_ids: list[int], name: str, max_points: int, t0: dict[int, float], totals: dict[tuple[int, str], rollups.Agg]
) -> dict | None:
    """The band of several runs' series (a configuration's seeds) too long to draw whole,
    from their rollups: steps cut into the blocks downsampling would use (one grid for
    every seed), and per block the lowest point of any seed, the highest, the mean over
    seeds of each seed's mean in the block, and at the block's last step and the seeds'
    mean wall time there. {"steps", "mean", "min", "max", "wall"}, None without points.
    `totals`: `rollups.totals` of (at least) these runs' series."""
    totals = {key: agg for key, agg in totals.items() if key[1] == name and key[0] in run_ids}
    if not totals:
        return None
    keep = (max(int(max_points), 3) - 1) // 2
    first = min(a.first_step for a in totals.values())
    last = max(a.last_step for a in totals.values())
    width = widest_fit(last - first + 1, keep)
    by_idx: dict[int, dict[int, list[rollups.Agg]]] = defaultdict(lambda: defaultdict(list))
    for (run_id, _), buckets in rollups.rows(list({r for r, _ in totals}), [name], width).items():
        for idx, agg in buckets:
            by_idx[idx][run_id].append(agg)
    idxs = sorted(by_idx)
    size = -(-len(idxs) // keep)
    band: dict[str, list] = {"steps": [], "mean": [], "min": [], "max": [], "wall": []}
    for start in range(0, len(idxs), size):
        seeds: dict[int, list[rollups.Agg]] = defaultdict(list)
        for idx in idxs[start : start + size]:
            for run_id, aggs in by_idx[idx].items():
                seeds[run_id].extend(aggs)
        # (aggs are in step order per seed; only the four figures the band needs)
        band["steps"].append(max(aggs[-1].last_step for aggs in seeds.values()))
        band["mean"].append(fmean(sum(a.total for a in aggs) / sum(a.n for a in aggs) for aggs in seeds.values()))
        band["min"].append(min(a.lo for aggs in seeds.values() for a in aggs))
        band["max"].append(max(a.hi for aggs in seeds.values() for a in aggs))
        band["wall"].append(fmean(aggs[-1].last_time - t0.get(r, 0.0) for r, aggs in seeds.items()))
    return band


def read_series(
    run: Run,
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
    *,
    from_step: int | None = None,
    to_step: int | None = None,
) -> dict[str, dict]:
    """{name: {"steps", "values", "times", "total", "last_step", "downsampled"}} for the
    run's series (all, or those named), with steps > after_step and in [from_step,
    to_step] only when given (see read_many)."""
    return read_many([run.pk], series, after_step, max_points, from_step=from_step, to_step=to_step)[run.pk]
