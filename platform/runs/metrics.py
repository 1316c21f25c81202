"""Reading runs' series for charts, downsampled from their rollups.

A long run has 100k+ points per series; a chart needs a few hundred. Min-max decimation
keeps, per group of consecutive steps, the lowest and the highest point, so spikes
survive (an average would hide a staleness burst), plus the series' last point so a live
chart appends new steps after it.

The groups are rollup buckets (runs/rollups.py): for a long series the narrowest level
with at most FAN_OUT × the wanted number of buckets is read and consecutive buckets are
merged down to that number, so a read costs a few hundred rows per series however many
points were stored. A series short enough to show whole is read point by point.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from statistics import fmean

from runs import rollups
from runs.models import MetricPoint, Run

# (run, series) pairs whose rollup rows one query reads (see read_many).
PAIRS_PER_READ = 4


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


def _raw(pairs: list[tuple[int, str]], after: int) -> dict[tuple[int, str], list[tuple]]:
    out: dict[tuple[int, str], list[tuple]] = defaultdict(list)
    for runs, names in _by_series_set(pairs):
        rows = (
            MetricPoint.objects.filter(run_id__in=runs, series__in=names, step__gt=after)
            .order_by("run_id", "series", "step")
            .values_list("run_id", "series", "step", "value", "time")
        )
        for run_id, name, step, value, t in rows:
            out[(run_id, name)].append((step, value, t))
    return out


def decimate(buckets: list[rollups.Agg], keep: int, last: rollups.Agg, after: int) -> list[tuple]:
    """(step, value, time) points: consecutive buckets merged into at most `keep` groups,
    each giving its first lowest and first highest point, then the series' last point;
    only steps > after."""
    size = -(-len(buckets) // keep)
    points: list[tuple] = []
    for start in range(0, len(buckets), size):
        group = rollups.merge(buckets[start : start + size])
        lo = (group.lo_step, group.lo, group.lo_time)
        hi = (group.hi_step, group.hi, group.hi_time)
        points.extend(sorted({lo, hi}))
    if not points or points[-1][0] != last.last_step:
        points.append((last.last_step, last.last_value, last.last_time))
    return [p for p in points if p[0] > after]


def read_many(
    run_ids: Iterable[int],
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
    *,
    only: set[tuple[int, str]] | None = None,
    totals: dict[tuple[int, str], rollups.Agg] | None = None,
) -> dict[int, dict[str, dict]]:
    """{run_id: {name: {"steps", "values", "times", "total", "last_step", "downsampled"}}}
    for the runs' series (all, or those named; only the (run, name) pairs in `only` when
    given), with steps > after_step only when given; each series min-max downsampled to
    at most `max_points` points. `total` counts all the series' stored points, whatever
    after_step. `totals`: the runs' `rollups.totals` when the caller has read them."""
    run_ids = [int(r) for r in run_ids]
    out: dict[int, dict[str, dict]] = {r: {} for r in run_ids}
    if totals is None:
        totals = rollups.totals(run_ids, series)
    if only is not None:
        totals = {key: agg for key, agg in totals.items() if key in only}
    max_points = max(int(max_points), 3)
    keep = (max_points - 1) // 2
    after = -(2**62) if after_step is None else int(after_step)

    raw: list[tuple[int, str]] = []
    coarse: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for key, agg in totals.items():
        if agg.last_step <= after:
            continue  # nothing newer
        first = max(agg.first_step, after + 1)
        # After a step only the span is known: it bounds the points left (one per step).
        count = agg.n if after_step is None else agg.last_step - first + 1
        if count <= max_points:
            raw.append(key)
        else:
            coarse[widest_fit(agg.last_step - first + 1, keep)].append(key)

    points = dict(_raw(raw, after))
    for width, pairs in coarse.items():
        # A few series at a time, each decimated before the next are read: a long
        # series' level is up to FAN_OUT × keep rows, and every series' rows held at
        # once made a read's memory peak grow with the run (a 28-series run page at 40k
        # steps: the web's RSS swung by 70 MB with it).
        ordered = sorted(pairs)
        for block in (ordered[i : i + PAIRS_PER_READ] for i in range(0, len(ordered), PAIRS_PER_READ)):
            for runs, names in _by_series_set(block):
                levels = rollups.rows(runs, names, width, min_idx=max(after, 0) // width)
                for key in set(block) & set(levels):
                    points[key] = decimate([agg for _, agg in levels.pop(key)], keep, totals[key], after)

    for (run_id, name), agg in totals.items():
        kept = points.get((run_id, name))
        if kept:
            out[run_id][name] = {
                "steps": [p[0] for p in kept],
                "values": [p[1] for p in kept],
                "times": [p[2] for p in kept],
                "total": agg.n,
                # The points and the totals are two reads: a point stored between them
                # is in `steps` but newer than the totals say.
                "last_step": max(agg.last_step, kept[-1][0]),
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
) -> dict[str, dict]:
    """{name: {"steps", "values", "times", "total", "last_step", "downsampled"}} for the
    run's series (all, or those named), with steps > after_step only when given."""
    return read_many([run.pk], series, after_step, max_points)[run.pk]
