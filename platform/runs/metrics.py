"""Reading a run's series for charts, downsampled on the server.

A long run has 100k+ points per series; a chart needs a few thousand. Min-max
decimation keeps, per bucket of consecutive steps, the lowest and the highest point, so
spikes survive (an average would hide a staleness burst), plus the last point so a
live chart appends new steps after it.
"""

from __future__ import annotations

from itertools import groupby

from runs.models import MetricPoint, Run


def min_max_decimate(rows: list[tuple[int, float, float]], max_points: int) -> list:
    """At most `max_points` of (step, value, time) rows, ordered by step."""
    if len(rows) <= max_points:
        return rows
    max_points = max(max_points, 3)
    buckets = (max_points - 1) // 2
    size = -(-len(rows) // buckets)  # ceil
    keep: list[int] = []
    for start in range(0, len(rows), size):
        chunk = range(start, min(start + size, len(rows)))
        lo = min(chunk, key=lambda i: rows[i][1])
        hi = max(chunk, key=lambda i: rows[i][1])
        keep.extend(sorted({lo, hi}))
    if keep[-1] != len(rows) - 1:
        keep.append(len(rows) - 1)
    return [rows[i] for i in keep]


def read_series(
    run: Run,
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
) -> dict[str, dict]:
    """{name: {"steps", "values", "times", "total", "last_step", "downsampled"}} for the
    run's series (all, or those named), with steps > after_step only when given."""
    points = MetricPoint.objects.filter(run=run)
    if series:
        points = points.filter(series__in=series)
    if after_step is not None:
        points = points.filter(step__gt=after_step)
    rows = points.order_by("series", "step").values_list("series", "step", "value", "time")

    out: dict[str, dict] = {}
    for name, group in groupby(rows.iterator(chunk_size=10000), key=lambda r: r[0]):
        full = [(step, value, t) for _, step, value, t in group]
        kept = min_max_decimate(full, max_points)
        out[name] = {
            "steps": [r[0] for r in kept],
            "values": [r[1] for r in kept],
            "times": [r[2] for r in kept],
            "total": len(full),
            "last_step": full[-1][0],
            "downsampled": len(kept) < len(full),
        }
    return out
