"""Reading runs' series for charts, downsampled in the database.

A long run has 100k+ points per series; a chart needs a few thousand. Min-max
decimation keeps, per bucket of consecutive steps, the lowest and the highest point, so
spikes survive (an average would hide a staleness burst), plus the last point so a
live chart appends new steps after it.

The database does the bucketing (`DECIMATE_SQL`): shipping every point to Python costs
far more than the aggregation itself. The statement uses only standard SQL (CTEs,
integer division, ROW_NUMBER() windows), so the same text runs on SQLite (3.25+) and
PostgreSQL; `min_max_decimate` is the same rule in Python, for rows already in memory.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

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


# One statement for every (run, series) asked: `stats` counts each series' points and
# its step range; a series with more than `max_points` is cut into `buckets` equal step
# ranges (k = its bucket) and keeps each bucket's first minimum and first maximum
# (ties go to the lower step) and its own last point; a shorter one keeps every point
# (k = step, one point per bucket). At most 2 × buckets + 1 ≤ max_points rows each.
DECIMATE_SQL = """
WITH pts AS (
    SELECT run_id, series, step, value, "time" FROM {table}
    WHERE run_id IN ({runs}) {series_filter} AND step > %(after)s
),
stats AS (
    SELECT run_id, series, COUNT(*) AS n, MIN(step) AS s0, MAX(step) AS s1
    FROM pts GROUP BY run_id, series
),
bucketed AS (
    SELECT p.run_id, p.series, p.step, p.value, p."time", st.n, st.s1,
        CASE WHEN st.n <= %(max_points)s THEN p.step
             ELSE (p.step - st.s0) * %(buckets)s / (st.s1 - st.s0 + 1) END AS k
    FROM pts p JOIN stats st ON st.run_id = p.run_id AND st.series = p.series
),
ranked AS (
    SELECT run_id, series, step, value, "time", n, s1,
        ROW_NUMBER() OVER (PARTITION BY run_id, series, k ORDER BY value ASC, step ASC) AS lo,
        ROW_NUMBER() OVER (PARTITION BY run_id, series, k ORDER BY value DESC, step ASC) AS hi
    FROM bucketed
)
SELECT run_id, series, step, value, "time", n, s1 FROM ranked
WHERE lo = 1 OR hi = 1 OR step = s1
ORDER BY run_id, series, step
"""


def read_many(
    run_ids: Iterable[int],
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
) -> dict[int, dict[str, dict]]:
    """{run_id: {name: {"steps", "values", "times", "total", "last_step", "downsampled"}}}
    for the runs' series (all, or those named), with steps > after_step only when given;
    each series min-max downsampled in the database to at most `max_points` points."""
    run_ids = [int(r) for r in run_ids]
    out: dict[int, dict[str, dict]] = {r: {} for r in run_ids}
    if not run_ids:
        return out
    max_points = max(int(max_points), 3)
    params: dict[str, object] = {
        "after": -(2**62) if after_step is None else int(after_step),
        "max_points": max_points,
        "buckets": (max_points - 1) // 2,
    }
    params.update({f"r{i}": r for i, r in enumerate(run_ids)})
    series_filter = ""
    if series:
        params.update({f"s{i}": s for i, s in enumerate(series)})
        series_filter = "AND series IN (" + ", ".join(f"%(s{i})s" for i in range(len(series))) + ")"
    sql = DECIMATE_SQL.format(
        table=MetricPoint._meta.db_table,
        runs=", ".join(f"%(r{i})s" for i in range(len(run_ids))),
        series_filter=series_filter,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for run_id, name, step, value, t, total, last_step in rows:
        s = out[run_id].get(name)
        if s is None:
            s = out[run_id][name] = {
                "steps": [],
                "values": [],
                "times": [],
                "total": int(total),
                "last_step": int(last_step),
                "downsampled": False,
            }
        s["steps"].append(int(step))
        s["values"].append(value)
        s["times"].append(t)
    for by_name in out.values():
        for s in by_name.values():
            s["downsampled"] = len(s["steps"]) < s["total"]
    return out


def read_series(
    run: Run,
    series: list[str] | None = None,
    after_step: int | None = None,
    max_points: int = 2000,
) -> dict[str, dict]:
    """{name: {"steps", "values", "times", "total", "last_step", "downsampled"}} for the
    run's series (all, or those named), with steps > after_step only when given."""
    return read_many([run.pk], series, after_step, max_points)[run.pk]
