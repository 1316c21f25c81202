"""The run page's metrics read costs the chart's size, not the run's length, and a chart
zoomed into a step range gets that range's own detail."""

from __future__ import annotations

import random

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import rollups
from runs.metrics import decimate, read_series
from runs.models import MetricPoint

T0 = 1_700_000_000.0


def store(run, series: str, values: list[float]) -> None:
    MetricPoint.objects.upsert(run.pk, [(series, step, v, T0 + step) for step, v in enumerate(values)])


def gauss(n: int, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0, 1) for _ in range(n)]


def expected_in_range(values: list[float], max_points: int, lo: int, hi: int) -> list[int]:
    """The steps a read of [lo, hi] keeps, from the points themselves: the range's steps
    cut into blocks of the narrowest rollup width with at most 4× the wanted buckets
    (every block holding a step of the range, whole), consecutive blocks merged into
    groups of equal count, each group's first min and first max inside the range, and
    the range's last step; every step when they are few enough."""
    keep = (max_points - 1) // 2
    steps = [s for s in range(len(values)) if lo <= s <= hi]
    if len(steps) <= max_points:
        return steps
    span = steps[-1] - steps[0] + 1
    width = next((w for w in rollups.WIDTHS if -(-span // w) <= 4 * keep), rollups.WIDTHS[-1])
    blocks = list(range(steps[0] // width, steps[-1] // width + 1))
    size = -(-len(blocks) // keep)
    want = {steps[-1]}
    for start in range(0, len(blocks), size):
        group = set(blocks[start : start + size])
        members = [s for s in range(len(values)) if s // width in group]
        want.add(min(members, key=lambda s: (values[s], s)))
        want.add(min(members, key=lambda s: (-values[s], s)))
    return sorted(s for s in want if lo <= s <= hi)


@pytest.mark.parametrize("lo, hi", [(5000, 9000), (4999, 15_999), (0, 3333), (12_000, 19_999)])
def test_a_zoom_is_downsampled_within_its_range_and_ends_at_its_last_point(run, lo, hi):
    values = gauss(20_000)
    spike = (lo + hi) // 2
    values[spike] = 50.0
    store(run, "staleness/max", values)
    got = read_series(run, max_points=101, from_step=lo, to_step=hi)["staleness/max"]
    assert got["steps"] == expected_in_range(values, 101, lo, hi)
    assert got["values"] == [values[s] for s in got["steps"]]
    assert got["times"] == [T0 + s for s in got["steps"]]
    assert spike in got["steps"] and got["steps"][-1] == hi
    assert got["downsampled"] and got["total"] == 20_000 and got["last_step"] == 19_999
    # The zoom's detail: more of the range's points than the whole run's chart shows there.
    whole = read_series(run, max_points=101)["staleness/max"]["steps"]
    assert len(got["steps"]) > 1.5 * len([s for s in whole if lo <= s <= hi])


def test_a_range_short_enough_comes_back_whole_and_after_step_cuts_it_too(run):
    values = gauss(20_000)
    store(run, "loss", values)
    got = read_series(run, ["loss"], max_points=100, from_step=1000, to_step=1050)["loss"]
    assert got["steps"] == list(range(1000, 1051)) and not got["downsampled"]
    assert got["values"] == values[1000:1051]
    newer = read_series(run, ["loss"], after_step=1040, max_points=100, from_step=1000, to_step=1050)["loss"]
    assert newer["steps"] == list(range(1041, 1051))
    # Only the lower bound, or only the upper one.
    assert read_series(run, ["loss"], max_points=100, from_step=19_990)["loss"]["steps"] == list(range(19_990, 20_000))
    assert read_series(run, ["loss"], max_points=100, to_step=9)["loss"]["steps"] == list(range(10))


def test_a_sparse_series_in_a_wide_range_comes_back_whole(run):
    # Few points over many steps: the range's span says "long", the point count "short".
    MetricPoint.objects.upsert(
        run.pk, [("eval/pass@1", step, step / 1e5, T0 + step) for step in range(0, 100_000, 100)]
    )
    got = read_series(run, ["eval/pass@1"], max_points=2000, after_step=-1)["eval/pass@1"]
    assert got["steps"] == list(range(0, 100_000, 100)) and not got["downsampled"]


def test_a_range_outside_the_series_leaves_it_out(run):
    store(run, "loss", gauss(5000))
    store(run, "reward/mean", gauss(50))
    got = read_series(run, max_points=100, from_step=1000, to_step=4000)
    assert set(got) == {"loss"}
    assert read_series(run, max_points=100, from_step=6000) == {}


def test_the_read_costs_the_charts_size_not_the_runs_length(run, monkeypatch):
    # One series 4× as long as another: both read at most FAN_OUT × keep buckets, in
    # one statement each after the totals.
    store(run, "loss", gauss(12_000, seed=1))
    store(run, "staleness/max", gauss(48_000, seed=2))
    read: dict[str, int] = {}
    extremes = rollups.extremes

    def counted(levels, **kw):
        for key, rows in extremes(levels, **kw):
            read[key[1]] = len(rows)
            yield key, rows

    statements: list[str] = []

    def log(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    monkeypatch.setattr(rollups, "extremes", counted)
    with connection.execute_wrapper(log):
        got = read_series(run, max_points=201)
    keep = 100
    assert set(read) == {"loss", "staleness/max"}
    assert all(keep < rows <= rollups.FAN_OUT * keep for rows in read.values()), read
    assert all(len(s["steps"]) <= 201 and s["downsampled"] for s in got.values())
    assert len(statements) == 1 + 2, statements


def test_the_totals_find_the_widest_level_through_its_own_index(run):
    store(run, "loss", gauss(100))
    with CaptureQueriesContext(connection) as queries:
        rollups.totals([run.pk])
    [query] = queries
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A table this small is read whole when allowed: ask whether the index serves.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + query["sql"])
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + query["sql"])
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert rollups.WIDEST_INDEX in plan, plan


def test_on_sqlite_a_charts_buckets_are_read_from_an_index_alone(run):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL keeps no such index: it would stop the buckets' updates in place")
    store(run, "loss", gauss(100))
    with CaptureQueriesContext(connection) as queries:
        [(_, rows)] = rollups.extremes([(run.pk, "loss", 16, 0, 10)])
    assert len(rows) == 7
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + queries[0]["sql"])
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert f"COVERING INDEX {rollups.EXTREMES_INDEX}" in plan, plan


def test_decimation_keeps_the_first_of_equal_lows_and_highs():
    # (lo_step, lo, lo_time, hi_step, hi, hi_time) of four buckets merged into two groups.
    rows = [(0, 1.0, 10.0, 5, 3.0, 15.0), (8, 1.0, 18.0, 9, 3.0, 19.0), (16, 2.0, 26.0, 20, 4.0, 30.0)]
    rows.append((31, 0.5, 41.0, 24, 4.0, 34.0))
    assert decimate(rows, 2) == ([0, 5, 20, 31], [1.0, 3.0, 4.0, 0.5], [10.0, 15.0, 30.0, 41.0])
    # One point that is both a group's lowest and highest comes once.
    assert decimate([(7, 1.0, 17.0, 7, 1.0, 17.0)], 5) == ([7], [1.0], [17.0])


# --- the API --------------------------------------------------------------------------


def test_the_metrics_api_takes_a_step_range(client_for, owner, run):
    values = gauss(20_000)
    store(run, "staleness/max", values)
    body = client_for(owner).get(f"/api/runs/{run.pk}/metrics?from_step=5000&to_step=9000&max_points=101").json()
    assert (
        body["series"]["staleness/max"]
        == read_series(run, max_points=101, from_step=5000, to_step=9000)["staleness/max"]
    )
    assert body["series"]["staleness/max"]["steps"] == expected_in_range(values, 101, 5000, 9000)


@pytest.mark.parametrize(
    "query, field",
    [
        ("from_step=x", "from_step"),
        ("to_step=1.5", "to_step"),
        ("from_step=-1", "from_step"),
        ("to_step=99999999999999999999", "to_step"),
        ("from_step=10&to_step=9", "to_step"),
    ],
)
def test_a_bad_step_range_is_a_400_naming_the_parameter(client_for, owner, run, query, field):
    r = client_for(owner).get(f"/api/runs/{run.pk}/metrics?{query}")
    assert r.status_code == 400
    assert field in r.json()["errors"]
