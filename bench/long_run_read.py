"""A long run's page, opened: one run with STEPS steps × SERIES series stored as the
ingest stores them (the points table, then the run's rollups built by runs/rollups.py's
own `rebuild`), then the run page's metrics read timed REPEAT times, warm:

- `read_series(run)`, the function the page's API view calls, as the page asks it (all
  series, the default max_points);
- GET /api/runs/<id>/metrics through Django's test client (the view, its JSON);
- a live refresh (after_step near the end), and a zoom into a tenth of the run
  (from_step/to_step) through the API.

Prints p50/p95/max per read, on the embedded SQLite (a throwaway file) and on PostgreSQL
(a throwaway database made beside --database-url and dropped afterwards), each in a
process of its own since Django's settings are per process.

    .venv/bin/python bench/long_run_read.py       # 100,000 steps × 30 series, both databases
    .venv/bin/python bench/long_run_read.py --steps 5000 --series 4 --databases sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import loadsite

TARGET_P95_S = 0.3
# Steps per batch with --store ingest: what a busy reporter posts at once.
INGEST_STEPS = 16
DATABASES = ("sqlite", "postgresql")


def series_names(n: int) -> list[str]:
    from workers.core.metric_names import NAMES

    # The engine's own names first (reward/mean's rollups keep trailing means), then more.
    names = sorted(NAMES)
    return (names + [f"bench/extra-{i:03d}" for i in range(max(0, n - len(names)))])[:n]


def values(name: str, steps: int) -> list[float]:
    """A noisy random walk with a rare spike: what decimation must keep."""
    rng = random.Random(name)
    out, level = [], 0.0
    for _ in range(steps):
        level += rng.gauss(0, 0.01)
        out.append(level + rng.gauss(0, 0.1) + (5.0 if rng.random() < 1e-4 else 0.0))
    return out


def seed(steps: int, series: int, store: str) -> tuple[object, object]:
    """A user, and a run of theirs holding steps × series points with their rollups:
    stored in bulk and the rollups built by `rollups.rebuild` (store="rebuild"), or
    posted batch by batch through the ingest's own upsert, rollups kept up to date as
    they come (store="ingest": slower, but the buckets lie in the table as a real run
    leaves them, every series' interleaved)."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from runs import rollups
    from runs.models import Experiment, MetricPoint, Run
    from teams.models import Membership, Team
    from workers.config.presets import build

    user = get_user_model().objects.create_user(f"bench-read-{uuid.uuid4().hex[:8]}")
    team = Team.objects.create(name=f"Bench read {uuid.uuid4().hex[:8]}")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="long run")
    run = Run.objects.create(
        experiment=experiment,
        name=f"{steps} steps × {series} series",
        preset="async",
        config=build("async").model_dump(mode="json"),
        status=Run.Status.RUNNING,
    )
    table = MetricPoint._meta.db_table
    names = series_names(series)
    started = time.perf_counter()
    if store == "ingest":
        columns = {name: values(name, steps) for name in names}
        for first in range(0, steps, INGEST_STEPS):
            batch = range(first, min(first + INGEST_STEPS, steps))
            MetricPoint.objects.upsert(
                run.pk, [(name, s, columns[name][s], 1.7e9 + 0.5 * s) for s in batch for name in names]
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        print(
            f"  posted {steps * series:,} points through the ingest's upsert in {time.perf_counter() - started:.0f} s"
        )
        return user, run
    with transaction.atomic(), connection.cursor() as cursor:
        for name in names:
            rows = [(run.pk, name, s, v, 1.7e9 + 0.5 * s) for s, v in enumerate(values(name, steps))]
            if connection.vendor == "postgresql":
                with cursor.cursor.copy(f'COPY {table} (run_id, series, step, value, "time") FROM STDIN') as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                cursor.executemany(
                    f'INSERT INTO {table} (run_id, series, step, value, "time") VALUES (%s, %s, %s, %s, %s)', rows
                )
    seeded = time.perf_counter() - started
    started = time.perf_counter()
    rollups.rebuild(run.pk)
    built = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"  stored {steps * series:,} points in {seeded:.0f} s, built their rollups in {built:.0f} s", flush=True)
    return user, run


def timed(fn, repeat: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def measure(steps: int, series: int, repeat: int, store: str) -> dict:
    """Seed, then time each read: {label: [seconds]} and the answers' sizes."""
    from django.conf import settings
    from django.db import connection
    from django.test import Client

    from runs.metrics import read_series

    user, run = seed(steps, series, store)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    url = f"/api/runs/{run.pk}/metrics"
    sizes: dict[str, int] = {}

    def get(query: str = "", label: str = "") -> None:
        r = client.get(url + query)
        assert r.status_code == 200, r.content[:300]
        sizes[label] = len(r.content)

    lo, hi = steps // 2, steps // 2 + steps // 10
    reads = {
        "read_series(run) (the page's read)": lambda: read_series(run),
        "GET …/metrics (the page's request)": lambda: get("", "page"),
        "GET …/metrics?after_step= (a live refresh)": lambda: get(f"?after_step={steps - 3}", "refresh"),
        "GET …/metrics?from_step=&to_step= (a zoom)": lambda: get(f"?from_step={lo}&to_step={hi}", "zoom"),
    }
    got = read_series(run)
    assert len(got) == series and all(s["last_step"] == steps - 1 for s in got.values()), "a series is short"
    out = {label: timed(fn, repeat) for label, fn in reads.items()}
    return {
        "vendor": connection.vendor,
        "max_points": settings.ROLLWAY_MAX_POINTS_PER_SERIES,
        "points_returned": sum(len(s["steps"]) for s in got.values()),
        "answer_bytes": sizes,
        "times": out,
    }


def child(args: argparse.Namespace) -> None:
    """One database, in this process: set Django up on it, measure, write the figures."""
    os.environ["DATABASE_URL"] = args.child_database
    os.environ.setdefault("ROLLWAY_HOME", args.child_home)
    os.environ["DJANGO_SETTINGS_MODULE"] = "rollway.settings"
    os.environ["ROLLWAY_LOG_LEVEL"] = "WARNING"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    figures = measure(args.steps, args.series, args.repeat, args.store)
    Path(args.child_out).write_text(json.dumps(figures))


def throwaway_postgres(url: str) -> tuple[str, str]:
    """(admin URL, URL of a new empty database) beside `url`'s."""
    import psycopg

    parts = urlsplit(url)
    name = f"bench_read_{uuid.uuid4().hex[:12]}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return admin, urlunsplit(parts._replace(path=f"/{name}"))


def drop_postgres(admin: str, database: str) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{urlsplit(database).path.lstrip("/")}" WITH (FORCE)')


def run_one(args: argparse.Namespace, vendor: str, home: str) -> dict:
    out = Path(home) / f"{vendor}.json"
    admin = database = None
    if vendor == "sqlite":
        database = f"sqlite:///{home}/long_run.sqlite3"
    else:
        admin, database = throwaway_postgres(args.database_url)
    try:
        flags = [
            *("--steps", str(args.steps), "--series", str(args.series)),
            *("--repeat", str(args.repeat), "--store", args.store),
        ]
        child_flags = ["--child-database", database, "--child-home", home, "--child-out", str(out)]
        done = subprocess.run([sys.executable, __file__, *flags, *child_flags], env=os.environ)
        if done.returncode:
            sys.exit(f"the {vendor} side failed (exit {done.returncode})")
        return json.loads(out.read_text())
    finally:
        if admin and not args.keep:
            drop_postgres(admin, database)


def report(figures: dict) -> bool:
    """Print one database's table; True when the page's read met the target."""
    print(
        f"{figures['vendor']}: max_points {figures['max_points']}, the page's read returns "
        f"{figures['points_returned']:,} points; answer sizes "
        + ", ".join(f"{k} {v / 1e3:,.0f} kB" for k, v in figures["answer_bytes"].items())
    )
    for label, times in figures["times"].items():
        print(f"  {label:<46} {loadsite.ms(loadsite.summary(times), ('p50', 'p95', 'max'))}")
    page = loadsite.summary(figures["times"]["GET …/metrics (the page's request)"])
    return page["p95"] < TARGET_P95_S


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100_000, help="steps of the run")
    p.add_argument("--series", type=int, default=30, help="series per step")
    p.add_argument("--repeat", type=int, default=30, help="timed reads of each kind (after 2 untimed)")
    p.add_argument(
        "--store",
        choices=("rebuild", "ingest"),
        default="rebuild",
        help="points in bulk then rollups.rebuild (default), or batch by batch through the ingest's upsert",
    )
    p.add_argument(
        "--databases",
        default=",".join(DATABASES),
        help=f"comma-separated, of {', '.join(DATABASES)} (default: both)",
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", ""),
        help="a PostgreSQL URL (default $DATABASE_URL): the bench makes its own database beside it",
    )
    p.add_argument("--keep", action="store_true", help="keep the PostgreSQL database and the SQLite file")
    p.add_argument("--json", help="also write the figures to this file")
    for hidden in ("--child-database", "--child-home", "--child-out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args()
    loadsite.require_positive(p, args, "steps", "series", "repeat")
    if args.child_database:
        child(args)
        return
    vendors = [v.strip() for v in args.databases.split(",") if v.strip()]
    bad = [v for v in vendors if v not in DATABASES]
    if bad or not vendors:
        p.error(f"--databases takes {' and/or '.join(DATABASES)} (got {args.databases!r})")
    if "postgresql" in vendors and not args.database_url.startswith(("postgres://", "postgresql://")):
        p.error("--database-url must be a PostgreSQL URL (postgres://…) to measure PostgreSQL, or --databases sqlite")
    loadsite.reexec_with_platform_path()
    home = tempfile.mkdtemp(prefix="rw-read-")
    print(f"one run of {args.steps:,} steps × {args.series} series; {args.repeat} timed reads each")
    print(loadsite.load_line() + " (shared machine: other work runs beside the bench)")
    figures, met = {}, True
    try:
        for vendor in vendors:
            figures[vendor] = run_one(args, vendor, home)
            met = report(figures[vendor]) and met
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(home, ignore_errors=True)
    print(loadsite.load_line())
    print(f"the page's request p95 < {TARGET_P95_S * 1000:.0f} ms: {'met' if met else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
