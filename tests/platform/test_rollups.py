"""Series rollups stay equal to what the stored points say, however the points arrive."""

from __future__ import annotations

import random
from collections import defaultdict
from statistics import fmean

import pytest

from runs import rollups
from runs.models import MetricPoint, SeriesBucket

pytestmark = pytest.mark.django_db


def expected_buckets(run) -> dict[tuple[str, int, int], dict]:
    """Every bucket at every width, computed straight from the stored points."""
    out = {}
    by_series = defaultdict(list)
    for p in MetricPoint.objects.filter(run=run).order_by("series", "step"):
        by_series[p.series].append(p)
    for series, points in by_series.items():
        values = [p.value for p in points]
        moving = [
            fmean(values[i - rollups.MOVING_WINDOW + 1 : i + 1])
            if i >= rollups.MOVING_WINDOW - 1 and series in rollups.MOVING_SERIES
            else None
            for i in range(len(points))
        ]
        for width in rollups.WIDTHS:
            groups = defaultdict(list)
            for i, p in enumerate(points):
                groups[p.step // width].append(i)
            for idx, members in groups.items():
                ps = [points[i] for i in members]
                lo = min(ps, key=lambda p: (p.value, p.step))
                hi = min(ps, key=lambda p: (-p.value, p.step))
                best = [moving[i] for i in members if moving[i] is not None]
                out[(series, width, idx)] = {
                    "n": len(ps),
                    "total": pytest.approx(sum(p.value for p in ps)),
                    "first_step": ps[0].step,
                    "lo": lo.value,
                    "lo_step": lo.step,
                    "lo_time": lo.time,
                    "hi": hi.value,
                    "hi_step": hi.step,
                    "hi_time": hi.time,
                    "min_time": min(p.time for p in ps),
                    "last_step": ps[-1].step,
                    "last_value": ps[-1].value,
                    "last_time": ps[-1].time,
                    "best_moving": pytest.approx(max(best)) if best else None,
                }
    return out


def stored_buckets(run) -> dict[tuple[str, int, int], dict]:
    return {
        (b.series, b.width, b.idx): {c: getattr(b, c) for c in rollups.COLUMNS}
        for b in SeriesBucket.objects.filter(run=run)
    }


def test_in_order_batches_keep_every_level_exact(run):
    rng = random.Random(1)
    for start in range(0, 1500, 97):
        batch = []
        for step in range(start, min(start + 97, 1500)):
            batch.append(("reward/mean", step, rng.random(), 1000.0 + step))
            if step % 3 == 0:  # a sparser series
                batch.append(("loss", step, rng.gauss(0, 1), 1000.0 + step))
        MetricPoint.objects.upsert(run.pk, batch)
    assert stored_buckets(run) == expected_buckets(run)


def test_out_of_order_points_and_overwrites_keep_every_level_exact(run):
    rng = random.Random(2)
    steps = list(range(0, 3000, 2))
    rng.shuffle(steps)
    for i in range(0, len(steps), 200):
        batch = [
            (s, st, rng.random(), 5000.0 + st + rng.random()) for st in steps[i : i + 200] for s in ("reward/mean", "x")
        ]
        MetricPoint.objects.upsert(run.pk, batch)
    # the spool sends some points again with other values, and late points fill gaps
    MetricPoint.objects.upsert(run.pk, [("reward/mean", st, 0.99, 5000.0 + st) for st in range(100, 160, 2)])
    MetricPoint.objects.upsert(run.pk, [("reward/mean", st, 0.01, 5000.0 + st) for st in range(101, 131, 2)])
    assert stored_buckets(run) == expected_buckets(run)


def test_rebuild_gives_what_refresh_kept(run):
    rng = random.Random(3)
    MetricPoint.objects.upsert(run.pk, [("reward/mean", st, rng.random(), float(st)) for st in range(700)])
    kept = stored_buckets(run)
    SeriesBucket.objects.filter(run=run).delete()
    assert rollups.rebuild(run.pk) == 700
    assert stored_buckets(run) == kept == expected_buckets(run)


def test_totals_first_reach_and_last_at_or_before_match_the_points(run):
    rng = random.Random(4)
    # reward rises with noise: the 5-point mean first reaches 0.7 somewhere in the middle
    points = [("reward/mean", st, min(1.0, st / 4000 + rng.random() * 0.3), 100.0 + st * 0.5) for st in range(5000)]
    MetricPoint.objects.upsert(run.pk, points)
    values = [v for _, _, v, _ in points]

    total = rollups.totals([run.pk])[(run.pk, "reward/mean")]
    assert total.n == 5000
    assert total.mean == pytest.approx(fmean(values))
    assert (total.hi, total.lo) == (max(values), min(values))

    for target in (0.2, 0.7, 0.95, 2.0):
        first = next(
            ((st, t) for i, (_, st, _, t) in enumerate(points) if i >= 4 and fmean(values[i - 4 : i + 1]) >= target),
            None,
        )
        got = rollups.first_reach([run.pk], "reward/mean", target)
        assert got.get(run.pk) == first, target

    for limit in (99.0, 100.0, 777.7, 1e9):
        last = [(st, v) for _, st, v, t in points if t <= limit]
        got = rollups.last_at_or_before("reward/mean", {run.pk: limit})
        assert got.get(run.pk) == (last[-1] if last else None), limit
