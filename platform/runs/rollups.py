"""Series rollups: per-bucket aggregates of a run's metric points, kept up to date as the
points are written, so that reads at scale touch aggregates instead of every point.

A run's series can hold 100k+ points, and a comparison reads 50 runs at once: a summary
or a chart computed from every point costs seconds however good the SQL is. So each
series' steps are cut into buckets of fixed width at several levels (`WIDTHS`, each
`FAN_OUT` times the last): bucket `idx` of width `w` holds the steps
[idx × w, (idx + 1) × w). A bucket (`SeriesBucket`) keeps its count and sum, its first
lowest and first highest point, its earliest time, its last point and, for the series in
`MOVING_SERIES`, the best trailing mean of `MOVING_WINDOW` points ending inside it.

Every one of these merges exactly from the bucket's children, so after a write the
buckets the new points fall in are recomputed bottom-up: the narrowest from the points
themselves, each wider one from its `FAN_OUT` children. A write touches a few rows per
level whatever the series' length. Recomputing (rather than adding the new points in)
keeps it exact when the reporter's spool sends a point again or a late point arrives out
of order.

Reads:
- `totals`: a whole series' aggregate, from the widest level (a row or two per series);
- `rows`: one level's buckets as aggregates, which runs/metrics.py merges into bands;
- `extremes`: one level's buckets as just their lowest and highest points, which
  runs/metrics.py merges into a downsampled chart;
- `first_reach` and `last_at_or_before`: "the first step whose trailing mean reaches x"
  and "the last point measured by time t", found by descending from the widest level
  to one narrow bucket (each aggregate they test is a max or a min, so a bucket passes
  only if one of its children does) and reading that bucket's points.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cached_property
from statistics import fmean
from typing import NamedTuple

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from runs import pgbulk
from workers.core.metric_names import REWARD_WINDOW

WIDTHS = (16, 64, 256, 1024, 4096, 16384, 65536)
FAN_OUT = 4
# Indexes the reads below rely on, made by a migration (a new widest width needs a new
# one): the widest level's rows alone (run, series, idx where width = WIDTHS[-1]) for
# `totals`; on SQLite, every column `extremes` reads, after the unique index's.
WIDEST_INDEX = "runs_bucket_widest"
EXTREMES_INDEX = "runs_bucket_extremes"
# The series whose buckets keep `best_moving`: the compare page's "time to target" asks
# when the mean of the last MOVING_WINDOW reward points first reached a target.
MOVING_SERIES = frozenset({"reward/mean"})
MOVING_WINDOW = REWARD_WINDOW
# Terms per OR-list in one statement (SQLite's default expression depth is 1000).
MAX_TERMS = 200


class _Tables:
    """The runs app's table names, looked up when first used: runs/models.py calls into
    this module, so this one does not import it."""

    @cached_property
    def points(self) -> str:
        return apps.get_model("runs", "MetricPoint")._meta.db_table

    @cached_property
    def buckets(self) -> str:
        return apps.get_model("runs", "SeriesBucket")._meta.db_table

    @cached_property
    def runs(self) -> str:
        return apps.get_model("runs", "Run")._meta.db_table


TABLES = _Tables()


class Agg(NamedTuple):
    """One bucket's aggregates (the columns of SeriesBucket after run, series, width, idx)."""

    n: int
    total: float
    first_step: int
    lo: float
    lo_step: int
    lo_time: float
    hi: float
    hi_step: int
    hi_time: float
    min_time: float
    last_step: int
    last_value: float
    last_time: float
    best_moving: float | None

    @property
    def mean(self) -> float:
        return self.total / self.n


COLUMNS = Agg._fields


def of_points(points: list[tuple[int, float, float]], moving: list[float | None]) -> Agg:
    """The aggregate of (step, value, time) points ordered by step, `moving[i]` being the
    trailing mean ending at point i (None where the window is not full)."""
    lo = min(points, key=lambda p: (p[1], p[0]))
    hi = min(points, key=lambda p: (-p[1], p[0]))
    last = points[-1]
    full = [m for m in moving if m is not None]
    return Agg(
        n=len(points),
        total=sum(p[1] for p in points),
        first_step=points[0][0],
        lo=lo[1],
        lo_step=lo[0],
        lo_time=lo[2],
        hi=hi[1],
        hi_step=hi[0],
        hi_time=hi[2],
        min_time=min(p[2] for p in points),
        last_step=last[0],
        last_value=last[1],
        last_time=last[2],
        best_moving=max(full) if full else None,
    )


def merge(children: list[Agg]) -> Agg:
    """The aggregate of consecutive buckets, given in step order."""
    lo = min(children, key=lambda a: (a.lo, a.lo_step))
    hi = min(children, key=lambda a: (-a.hi, a.hi_step))
    last = children[-1]
    moving = [a.best_moving for a in children if a.best_moving is not None]
    return Agg(
        n=sum(a.n for a in children),
        total=sum(a.total for a in children),
        first_step=children[0].first_step,
        lo=lo.lo,
        lo_step=lo.lo_step,
        lo_time=lo.lo_time,
        hi=hi.hi,
        hi_step=hi.hi_step,
        hi_time=hi.hi_time,
        min_time=min(a.min_time for a in children),
        last_step=last.last_step,
        last_value=last.last_value,
        last_time=last.last_time,
        best_moving=max(moving) if moving else None,
    )


def narrowest_blocks(points: list[tuple[int, float, float]], moving: list[float | None]) -> dict[int, Agg]:
    """{idx: aggregate} of (step, value, time) points (in step order, `moving[i]` the
    trailing mean at point i) cut into the narrowest blocks."""
    members: dict[int, list[int]] = defaultdict(list)
    for i, (step, _, _) in enumerate(points):
        members[step // WIDTHS[0]].append(i)
    return {idx: of_points([points[i] for i in rows], [moving[i] for i in rows]) for idx, rows in members.items()}


def trailing_means(values: list[float], skip: int = 0) -> list[float | None]:
    """The mean of the last MOVING_WINDOW values ending at each value (None before the
    window is full), for values[skip:] (the first `skip` only lead into windows)."""
    return [
        fmean(values[i - MOVING_WINDOW + 1 : i + 1]) if i >= MOVING_WINDOW - 1 else None
        for i in range(skip, len(values))
    ]


# --- keeping them up to date ----------------------------------------------------------


def _ranges(indexes: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted indexes as inclusive runs of consecutive ones: [1, 2, 3, 7] → [(1, 3), (7, 7)]."""
    out: list[list[int]] = []
    for i in sorted(set(indexes)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [(a, b) for a, b in out]


def _spans(indexes: Iterable[int], limit: int = MAX_TERMS) -> list[tuple[int, int]]:
    """`_ranges`, or the one range covering them all when there are too many to list
    in one statement (reading more rows than needed beats failing)."""
    ranges = _ranges(indexes)
    return ranges if len(ranges) <= limit else [(ranges[0][0], ranges[-1][1])]


def _in(values: list) -> str:
    return ", ".join(["%s"] * len(values))


def _chunks(items: list, size: int = MAX_TERMS) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# PostgreSQL's column types, for writing every row in one statement through unnest().
PG_TYPES = (
    *("bigint", "text", "int", "bigint"),  # run_id, series, width, idx
    *("int", "float8", "bigint"),  # n, total, first_step
    *("float8", "bigint", "float8") * 2,  # lo, lo_step, lo_time; hi, hi_step, hi_time
    *("float8", "bigint", "float8", "float8", "float8"),  # min_time, last_step, last_value, last_time, best_moving
)


def _write(cursor, run_id: int, levels: dict[int, dict[tuple[str, int], Agg]]) -> None:
    """Upsert buckets {width: {(series, idx): aggregate}} in as few statements as the
    database allows (a few hundred rows per write of points)."""
    rows = [(run_id, series, width, idx, *agg) for width, aggs in levels.items() for (series, idx), agg in aggs.items()]
    if not rows:
        return
    names = ", ".join(("run_id", "series", "width", "idx", *COLUMNS))
    conflict = "ON CONFLICT (run_id, series, width, idx) DO UPDATE SET " + ", ".join(
        f"{c} = EXCLUDED.{c}" for c in COLUMNS
    )
    if cursor.db.vendor == "postgresql":
        # One statement of fixed text whatever the row count: columns as arrays, bound
        # in binary (runs/pgbulk.py).
        arrays = ", ".join(f"%b::{t}[]" for t in PG_TYPES)
        with pgbulk.binary_cursor(cursor.db) as binary:
            binary.execute(
                f"INSERT INTO {TABLES.buckets} ({names}) SELECT * FROM unnest({arrays}) {conflict}",
                [list(column) for column in zip(*rows, strict=True)],
            )
        return
    # SQLite runs one prepared statement over every row in C.
    marks = ", ".join(["%s"] * (4 + len(COLUMNS)))
    cursor.executemany(f"INSERT INTO {TABLES.buckets} ({names}) VALUES ({marks}) {conflict}", rows)


def _preceding(cursor, run_id: int, series: str, step: int) -> list[float]:
    """The values of the MOVING_WINDOW − 1 points before `step`, oldest first."""
    cursor.execute(
        f"SELECT value FROM {TABLES.points} WHERE run_id = %s AND series = %s AND step < %s "
        "ORDER BY step DESC LIMIT %s",
        [run_id, series, step, MOVING_WINDOW - 1],
    )
    return [v for (v,) in reversed(cursor.fetchall())]


# The reads below ask for the union of the series' ranges ("series IN (...) AND (range OR
# range ...)"), not for each series' own ranges: in the usual case every series of a
# write covers the same steps, and a statement with a handful of terms plans in a
# fraction of the time one with a term per series takes. Rows outside a series' own
# ranges are dropped on arrival.


def _narrowest(cursor, run_id: int, touched: dict[str, set[int]]) -> dict[tuple[str, int], Agg]:
    """Recompute the narrowest buckets named in `touched` from their points."""
    width = WIDTHS[0]
    spans = _spans(i for idxs in touched.values() for i in idxs)
    names = list(touched)
    where = " OR ".join(["step BETWEEN %s AND %s"] * len(spans))
    cursor.execute(
        f'SELECT series, step, value, "time" FROM {TABLES.points} WHERE run_id = %s AND series IN ({_in(names)}) '
        f"AND ({where}) ORDER BY series, step",
        [run_id, *names, *(x for a, b in spans for x in (a * width, b * width + width - 1))],
    )
    ranges = {s: [(a * width, b * width + width - 1) for a, b in _ranges(idxs)] for s, idxs in touched.items()}
    by_range: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
    for series, step, value, t in cursor.fetchall():
        own = ranges[series]
        k = bisect_right(own, (step, float("inf"))) - 1
        if k >= 0 and own[k][0] <= step <= own[k][1]:
            by_range[(series, own[k][0])].append((step, value, t))
    out: dict[tuple[str, int], Agg] = {}
    for (series, start), points in by_range.items():
        values = [v for _, v, _ in points]
        if series in MOVING_SERIES:
            before = _preceding(cursor, run_id, series, start)
            moving = trailing_means(before + values, skip=len(before))
        else:
            moving = [None] * len(points)
        for idx, agg in narrowest_blocks(points, moving).items():
            out[(series, idx)] = agg
    return out


def _siblings(cursor, run_id: int, parents: list[dict[str, set[int]]]) -> dict[int, dict[tuple[str, int], Agg]]:
    """The stored children of the parent buckets named, all levels in one read:
    {child width: {(series, idx): aggregate}} (`parents[level]` names level's parents;
    children of other parents may come too)."""
    terms = [
        (WIDTHS[level - 1], a * FAN_OUT, b * FAN_OUT + FAN_OUT - 1)
        for level in range(1, len(WIDTHS))
        for a, b in _spans((i for idxs in parents[level].values() for i in idxs), MAX_TERMS // len(WIDTHS))
    ]
    names = list(parents[0])
    where = " OR ".join(["(width = %s AND idx BETWEEN %s AND %s)"] * len(terms))
    cursor.execute(
        f"SELECT series, width, idx, {', '.join(COLUMNS)} FROM {TABLES.buckets} "
        f"WHERE run_id = %s AND series IN ({_in(names)}) AND ({where})",
        [run_id, *names, *(x for term in terms for x in term)],
    )
    out: dict[int, dict[tuple[str, int], Agg]] = defaultdict(dict)
    for series, width, idx, *values in cursor.fetchall():
        out[width][(series, idx)] = Agg(*values)
    return out


def refresh(run_id: int, keys: Iterable[tuple[str, int]], using: str = DEFAULT_DB_ALIAS) -> None:
    """Bring the run's buckets up to date after the points at (series, step) `keys`
    were written (inserted or overwritten)."""
    newest: dict[str, int] = {}
    touched: dict[str, set[int]] = defaultdict(set)
    for series, step in keys:
        touched[series].add(step // WIDTHS[0])
        newest[series] = max(step, newest.get(series, step))
    if not touched:
        return
    connection = connections[using]
    # No savepoint inside the ingest's transaction (a round trip each way): a failure
    # here fails the whole write anyway.
    # On PostgreSQL the hundreds of bucket and point rows read below come back in
    # binary (runs/pgbulk.py).
    cursor_of = pgbulk.binary_cursor(connection, binary_results=True) if connection.vendor == "postgresql" else None
    with transaction.atomic(using=using, savepoint=False), cursor_of or connection.cursor() as cursor:
        # Two writers of one run take turns here: each recomputes from what is committed,
        # so the later one sees the earlier one's points (SQLite serializes writes anyway).
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        cursor.execute(f"SELECT id FROM {TABLES.runs} WHERE id = %s{lock}", [run_id])
        for series in touched.keys() & MOVING_SERIES:
            # A new point enters the trailing windows of the points after it: their
            # buckets change too (nothing after it in the usual, in-order case).
            cursor.execute(
                f"SELECT MAX(step) FROM (SELECT step FROM {TABLES.points} "
                "WHERE run_id = %s AND series = %s AND step > %s ORDER BY step LIMIT %s) later",
                [run_id, series, newest[series], MOVING_WINDOW - 1],
            )
            (later,) = cursor.fetchone()
            last = max(later or 0, newest[series]) // WIDTHS[0]
            touched[series].update(range(min(touched[series]), last + 1))
        # Which buckets change at each level, then every untouched sibling they merge
        # with in one read; the levels are recomputed bottom-up in memory and written
        # in one statement.
        parents = [touched]
        for _ in WIDTHS[1:]:
            parents.append({s: {i // FAN_OUT for i in idxs} for s, idxs in parents[-1].items()})
        stored = _siblings(cursor, run_id, parents)
        computed = {WIDTHS[0]: _narrowest(cursor, run_id, touched)}
        for level in range(1, len(WIDTHS)):
            below = {**stored[WIDTHS[level - 1]], **computed[WIDTHS[level - 1]]}
            children: dict[tuple[str, int], list[tuple[int, Agg]]] = defaultdict(list)
            for (series, idx), agg in below.items():
                if idx // FAN_OUT in parents[level].get(series, ()):
                    children[(series, idx // FAN_OUT)].append((idx, agg))
            computed[WIDTHS[level]] = {
                key: merge([a for _, a in sorted(kids, key=lambda k: k[0])]) for key, kids in children.items()
            }
        _write(cursor, run_id, computed)


def rebuild(run_id: int, using: str = DEFAULT_DB_ALIAS) -> int:
    """Recompute every bucket of a run from all its points (for points stored before
    rollups existed, or written around `refresh`). Returns how many points it read."""
    connection = connections[using]
    count = 0
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLES.buckets} WHERE run_id = %s", [run_id])
        cursor.execute(f"SELECT DISTINCT series FROM {TABLES.points} WHERE run_id = %s", [run_id])
        for (series,) in cursor.fetchall():
            cursor.execute(
                f'SELECT step, value, "time" FROM {TABLES.points} WHERE run_id = %s AND series = %s ORDER BY step',
                [run_id, series],
            )
            points = cursor.fetchall()
            count += len(points)
            values = [v for _, v, _ in points]
            moving = trailing_means(values) if series in MOVING_SERIES else [None] * len(points)
            level = narrowest_blocks(points, moving)
            levels = {WIDTHS[0]: level}
            for width in WIDTHS[1:]:
                parents: dict[int, list[Agg]] = defaultdict(list)
                for idx in sorted(level):
                    parents[idx // FAN_OUT].append(level[idx])
                level = levels[width] = {idx: merge(children) for idx, children in parents.items()}
            _write(cursor, run_id, {w: {(series, i): a for i, a in aggs.items()} for w, aggs in levels.items()})
    return count


# --- reading them ---------------------------------------------------------------------


def totals(
    run_ids: list[int], series: list[str] | None = None, using: str = DEFAULT_DB_ALIAS
) -> dict[tuple[int, str], Agg]:
    """{(run id, series): the aggregate of all its points} for the runs' series (all, or
    those named), from the widest level."""
    if not run_ids:
        return {}
    # The width is written into the statement, not bound: that is what lets both
    # databases use the widest level's own (partial) index, WIDEST_INDEX. Through the
    # unique index a run's every bucket of every width would be scanned to find them.
    sql = (
        f"SELECT run_id, series, {', '.join(COLUMNS)} FROM {TABLES.buckets} "
        f"WHERE width = {int(WIDTHS[-1])} AND run_id IN ({_in(run_ids)})"
    )
    params: list = [*run_ids]
    if series:
        sql += f" AND series IN ({_in(series)})"
        params += series
    groups: dict[tuple[int, str], list[Agg]] = defaultdict(list)
    with connections[using].cursor() as cursor:
        cursor.execute(sql + " ORDER BY run_id, series, idx", params)
        for run_id, name, *values in cursor.fetchall():
            groups[(run_id, name)].append(Agg(*values))
    return {key: merge(aggs) for key, aggs in groups.items()}


def rows(
    run_ids: list[int], series: list[str], width: int, min_idx: int = 0, using: str = DEFAULT_DB_ALIAS
) -> dict[tuple[int, str], list[tuple[int, Agg]]]:
    """{(run id, series): [(idx, aggregate)] in step order} of one level's buckets with
    idx ≥ min_idx."""
    out: dict[tuple[int, str], list[tuple[int, Agg]]] = defaultdict(list)
    if not run_ids or not series:
        return out
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT run_id, series, idx, {', '.join(COLUMNS)} FROM {TABLES.buckets} "
            f"WHERE width = %s AND run_id IN ({_in(run_ids)}) AND series IN ({_in(series)}) AND idx >= %s "
            "ORDER BY run_id, series, idx",
            [width, *run_ids, *series, min_idx],
        )
        for run_id, name, idx, *values in cursor.fetchall():
            out[(run_id, name)].append((idx, Agg(*values)))
    return out


# The columns a chart's min-max decimation reads of a bucket (runs/metrics.py `decimate`).
EXTREMES = ("lo_step", "lo", "lo_time", "hi_step", "hi", "hi_time")


def extremes(
    levels: Iterable[tuple[int, str, int, int, int]], using: str = DEFAULT_DB_ALIAS
) -> Iterator[tuple[tuple[int, str], list[tuple]]]:
    """For each (run id, series, width, first idx, last idx) in `levels`: ((run id,
    series), its buckets of that width with first idx ≤ idx ≤ last idx in step order,
    each as the EXTREMES tuple), one series at a time: a chart's read holds one series'
    rows, and each is a plain tuple of six numbers (an index range scan per series;
    on SQLite an index-only one, EXTREMES_INDEX)."""
    connection = connections[using]
    sql = (
        f"SELECT {', '.join(EXTREMES)} FROM {TABLES.buckets} "
        "WHERE run_id = %s AND series = %s AND width = %s AND idx BETWEEN %s AND %s ORDER BY idx"
    )
    # PostgreSQL sends the numbers in binary: none is parsed from text.
    binary = connection.vendor == "postgresql"
    with pgbulk.binary_cursor(connection, binary_results=True) if binary else connection.cursor() as cursor:
        for run_id, series, width, first, last in levels:
            cursor.execute(sql, [run_id, series, width, first, last])
            yield (run_id, series), cursor.fetchall()


def _descend(cursor, series: str, test: str, thresholds: dict[int, float], pick: str) -> dict[int, int]:
    """{run id: idx of the first (pick="MIN") or last (pick="MAX") narrowest bucket of
    `series` whose aggregate passes `test` (an SQL condition on one %s, the run's threshold)}.
    Only right for max/min-type aggregates: then a bucket passes iff one of its children does."""
    found: dict[int, tuple[int, int]] = {}  # run id → (first, last) candidate idx at the level
    for level in reversed(range(len(WIDTHS))):
        runs = list(thresholds) if level == len(WIDTHS) - 1 else list(found)
        if not runs:
            return {}
        answer: dict[int, int] = {}
        for chunk in _chunks(runs):
            if level == len(WIDTHS) - 1:
                terms = " OR ".join([f"(run_id = %s AND {test})"] * len(chunk))
                params = [x for r in chunk for x in (r, thresholds[r])]
            else:
                terms = " OR ".join([f"(run_id = %s AND idx BETWEEN %s AND %s AND {test})"] * len(chunk))
                params = [x for r in chunk for x in (r, *found[r], thresholds[r])]
            cursor.execute(
                f"SELECT run_id, {pick}(idx) FROM {TABLES.buckets} WHERE width = %s AND series = %s AND ({terms}) "
                "GROUP BY run_id",
                [WIDTHS[level], series, *params],
            )
            answer.update(cursor.fetchall())
        if level == 0:
            return answer
        found = {r: (idx * FAN_OUT, idx * FAN_OUT + FAN_OUT - 1) for r, idx in answer.items()}
    return {}


def first_reach(
    run_ids: list[int], series: str, target: float, using: str = DEFAULT_DB_ALIAS
) -> dict[int, tuple[int, float]]:
    """{run id: (step, time) of the first point whose trailing MOVING_WINDOW-point mean
    is ≥ target} for the runs that reached it (`series` must be in MOVING_SERIES)."""
    if series not in MOVING_SERIES:
        raise ValueError(f"{series} keeps no trailing means")
    out: dict[int, tuple[int, float]] = {}
    with connections[using].cursor() as cursor:
        found = _descend(cursor, series, "best_moving >= %s", {r: float(target) for r in run_ids}, "MIN")
        for run_id, idx in found.items():
            start = idx * WIDTHS[0]
            before = _preceding(cursor, run_id, series, start)
            cursor.execute(
                f'SELECT step, value, "time" FROM {TABLES.points} WHERE run_id = %s AND series = %s '
                "AND step BETWEEN %s AND %s ORDER BY step",
                [run_id, series, start, start + WIDTHS[0] - 1],
            )
            points = cursor.fetchall()
            moving = trailing_means(before + [v for _, v, _ in points], skip=len(before))
            for (step, _, t), m in zip(points, moving, strict=True):
                if m is not None and m >= target:
                    out[run_id] = (step, t)
                    break
    return out


def last_at_or_before(
    series: str, times: dict[int, float], using: str = DEFAULT_DB_ALIAS
) -> dict[int, tuple[int, float]]:
    """{run id: (step, value) of the series' last point (by step) whose time is ≤ the
    run's time in `times`}, for the runs that have one."""
    out: dict[int, tuple[int, float]] = {}
    with connections[using].cursor() as cursor:
        found = _descend(cursor, series, "min_time <= %s", times, "MAX")
        for run_id, idx in found.items():
            start = idx * WIDTHS[0]
            cursor.execute(
                f"SELECT step, value FROM {TABLES.points} WHERE run_id = %s AND series = %s "
                f'AND step BETWEEN %s AND %s AND "time" <= %s ORDER BY step DESC LIMIT 1',
                [run_id, series, start, start + WIDTHS[0] - 1, times[run_id]],
            )
            row = cursor.fetchone()
            if row:
                out[run_id] = (row[0], row[1])
    return out
