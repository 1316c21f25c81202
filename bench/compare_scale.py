"""The compare page at scale: seeds a throwaway SQLite database with RUNS runs × POINTS
points per series (5 configurations × 10 seeds by default), then prints

- the server time of GET /api/compare for all of them, as the page asks it: the tables
  (summary, configurations) first, then each chart's series as it comes into view, and
  everything at once for reference (target < 1 s), and
- the page's time to its first chart in Debian's Chromium (target < 2 s).

    .venv/bin/python bench/compare_scale.py                       # 50 runs × 100,000 points
    .venv/bin/python bench/compare_scale.py --runs 4 --points 2000
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import workers

REPO = Path(workers.__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def setup_django(home: str) -> None:
    os.environ["ROLLWAY_HOME"] = home
    os.environ["DATABASE_URL"] = f"sqlite:///{home}/compare.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")
    os.environ.setdefault("ROLLWAY_LOG_LEVEL", "WARNING")  # the figures, not every login
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(runs: int, points: int, series: list[str], configurations: int) -> tuple[list[int], object]:
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from runs import rollups
    from runs.models import Experiment, MetricPoint, Run
    from teams.models import Membership, Team
    from workers.config.presets import build

    user = get_user_model().objects.create_user("bench")
    team = Team.objects.create(name="Bench")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="scale")
    ids = []
    base = build("async").model_dump(mode="json")
    for i in range(runs):
        lr = 1e-5 * (1 + i % configurations)
        seed_no = i // configurations
        config = {**base, "seed": seed_no, "trainer": {**base["trainer"], "lr": lr}}
        run = Run.objects.create(
            experiment=experiment,
            name=f"lr {lr:g} seed {seed_no}",
            preset="async",
            overrides={"trainer": {"lr": lr}, "seed": seed_no},
            config=config,
            status=Run.Status.SUCCEEDED,
        )
        ids.append(run.pk)
    table = MetricPoint._meta.db_table
    sql = f'INSERT INTO {table} (run_id, series, step, value, "time") VALUES (%s, %s, %s, %s, %s)'
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        for n, run_id in enumerate(ids):
            rng = random.Random(run_id)
            for name in series:
                cursor.executemany(
                    sql, [(run_id, name, s, rng.random() + s / points, 1.7e9 + 0.5 * s) for s in range(points)]
                )
            if n % 10 == 9:
                print(f"  seeded {n + 1}/{len(ids)} runs ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"  seeded the points in {time.perf_counter() - started:.0f} s; building rollups", flush=True)
    started = time.perf_counter()
    for run_id in ids:
        rollups.rebuild(run_id)
    print(f"  built the rollups in {time.perf_counter() - started:.0f} s", flush=True)
    connection.cursor().execute("ANALYZE")
    return ids, user


def server_time(ids: list[int], user, repeat: int, query: str) -> list[float]:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    url = "/api/compare?runs=" + ",".join(map(str, ids)) + query
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - started)
        assert r.status_code == 200, r.content[:300]
    print(f"  answer size: {len(r.content) / 1e6:.2f} MB")
    return times


def time_to_first_chart(ids: list[int], user) -> float:
    from django.conf import settings
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application
    from django.test import Client
    from playwright.sync_api import sync_playwright

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context()
            context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": url}])
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/compare/?runs={','.join(map(str, ids))}")
            try:
                page.wait_for_function("() => document.body.dataset.firstChartMs", timeout=120_000)
            except Exception:
                state = page.locator("#live-state").text_content()
                charts = page.eval_on_selector_all("#charts .chart", "els => els.map(e => e.dataset.state)")
                sys.exit(f"no chart drew: page says {state!r}, chart states {charts[:6]}…, errors {errors[:5]}")
            ms = float(page.evaluate("() => document.body.dataset.firstChartMs"))
            # where the time went: each resource's start and end, ms since navigation start
            for name, start, end in page.evaluate(
                "() => [['page', 0, performance.getEntriesByType('navigation')[0].responseEnd]].concat("
                "performance.getEntriesByType('resource').map(r => [r.name.split('?')[0].split('/').pop() + "
                "(r.name.includes('what=charts') ? ' (a chart)' : r.name.includes('/api/') ? ' (tables)' : ''),"
                " r.startTime, r.responseEnd]))"
            ):
                print(f"    {name:<40} {start:7.0f} → {end:7.0f} ms")
            ready = float(page.evaluate("() => document.body.dataset.plotlyMs"))
            print(f"    Plotly parsed and ready at {ready:.0f} ms")
            browser.close()
    finally:
        server.shutdown()
    return ms / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--points", type=int, default=100_000, help="points per series per run")
    p.add_argument("--series", default="reward/mean,staleness/mean")
    p.add_argument("--configurations", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-browser", action="store_true")
    args = p.parse_args()
    if args.runs < 1 or args.points < 1 or args.configurations < 1:
        p.error("--runs, --points and --configurations must be ≥ 1")
    with tempfile.TemporaryDirectory(prefix="rollway-compare-") as home:
        setup_django(home)
        series = [s for s in args.series.split(",") if s]
        print(f"seeding {args.runs} runs × {len(series)} series × {args.points} points (SQLite, {home})")
        ids, user = seed(args.runs, args.points, series, args.configurations)
        # What the page asks: the tables first, then one chart's series per chart in view.
        for what, query in (
            ("the tables (series=)", "&series="),
            ("one chart (what=charts&series=reward/mean)", "&what=charts&series=reward/mean"),
            ("tables and every chart at once (no series=)", ""),
        ):
            times = server_time(ids, user, args.repeat, query)
            median, fastest = statistics.median(times), min(times)
            print(f"server time of /api/compare, {what}: median {median:.3f} s, min {fastest:.3f} s")
        if not args.no_browser:
            print(f"time to first chart in Chromium: {time_to_first_chart(ids, user):.3f} s")


if __name__ == "__main__":
    if importlib.util.find_spec("rollway") is None:
        # The Django side is a source root (platform/), not an installed package: run
        # again with it on PYTHONPATH, as `manage.py` and `up` do for their children.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    main()
