"""Ingest under load: RUNS runs at once (asyncio tasks), each posting batches to its own
run's ingest endpoint the way the engine's reporter does (SERIES series per step, STEPS
steps per batch), back to back, for SECONDS. Prints the accepted points/s after a
warm-up (overall and per 10 s window: target ≥ 10,000 points/s sustained), per-request
latency p50/p95/p99/max, errors, and whether the database holds exactly the points the
ingest accepted, with their rollups.

Then (--profile N, default 100; 0 skips) it times N more ingest requests in this process
through Django's test client on the same database and Redis, under cProfile, and prints
where one request's time goes (run lookup, validation, point upsert, rollups, commit,
the channel-layer send, connecting to the database) and the rest of the profile's top.

It starts its own site (daphne on a free port, the Redis channel layer) on the
PostgreSQL database given; with --url it loads a running site instead (--database-url
must be that site's database: the bench reads the runs' ingest tokens from it).

    DATABASE_URL=postgres://root@127.0.0.1:5432/bench REDIS_URL=redis://127.0.0.1:6379/11 \\
        .venv/bin/python bench/ingest_load.py                  # 20 runs × 60 s, 30 series × 5 steps
    .venv/bin/python bench/ingest_load.py --runs 2 --seconds 5 --profile 0 --json out.json
    .venv/bin/python bench/ingest_load.py --steps 16         # 480 points per request, as a busy reporter posts
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import re
import sys
import time

import loadsite

TARGET_POINTS_PER_S = 10_000
WINDOW_S = 10.0
# Where an ingest request spends its time: (label, file the function lives in, name).
# Cumulative times; the rows overlap where one calls another (the view holds the rest).
PHASES = (
    ("whole view (ingest_metrics)", "api/ingest.py", "ingest_metrics"),
    ("  run lookup + token check", "api/ingest.py", "_authorized_run"),
    ("  JSON parse + validation", "pydantic/type_adapter.py", "validate_json"),
    ("  point upsert (INSERT … ON CONFLICT)", "runs/models.py", "_upsert_postgresql"),
    ("  rollups (runs/rollups.py refresh)", "runs/rollups.py", "refresh"),
    ("  COMMIT", "django/db/backends/base/base.py", "_commit"),
    ("  channel-layer send (on commit)", "runs/events.py", "send_points"),
    ("  opening the DB connection (or taking one from the pool)", "django/db/backends/base/base.py", "connect"),
)


def series_names(n: int) -> list[str]:
    from workers.core.metric_names import NAMES

    names = sorted(NAMES)
    # The engine's own names first (their rollups are what a real run builds), then more.
    return (names + [f"bench/extra-{i:03d}" for i in range(max(0, n - len(names)))])[:n]


def batch(names: list[str], first_step: int, steps: int) -> bytes:
    now = time.time()
    return json.dumps(
        {
            "points": [
                {"series": s, "step": step, "value": (step * 31 + i) % 97 / 97, "time": now + i * 1e-6}
                for step in range(first_step, first_step + steps)
                for i, s in enumerate(names)
            ]
        }
    ).encode()


def windows(log: list[tuple[float, float, int, int]], start: float, end: float, width: float) -> list[float]:
    """Accepted points/s in consecutive windows of `width` s between start and end, from
    (finished at, latency, HTTP status, accepted) records."""
    n = max(1, int((end - start) // width))
    bins = [0] * n
    for done, _, _, accepted in log:
        k = int((done - start) // width)
        if 0 <= k < n:
            bins[k] += accepted
    return [b / width for b in bins]


async def load(args, url: str, runs: list[tuple[int, str]], web_pid: int | None = None) -> dict:
    import httpx

    names = series_names(args.series)
    log: list[tuple[float, float, int, int]] = []  # (finished at, latency, status, accepted)
    errors: dict[str, int] = {}
    per_run = {run_id: 0 for run_id, _ in runs}
    limits = httpx.Limits(max_connections=len(runs) + 4, max_keepalive_connections=len(runs) + 4)
    start = time.perf_counter()
    until = start + args.warmup + args.seconds

    async def feed(client: httpx.AsyncClient, run_id: int, token: str) -> None:
        step = 0
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while time.perf_counter() < until:
            body = batch(names, step, args.steps)
            t = time.perf_counter()
            try:
                r = await client.post(f"/api/runs/{run_id}/metrics", content=body, headers=headers)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                await asyncio.sleep(0.5)  # a site that is down is not hammered in a tight loop
                continue
            done = time.perf_counter()
            accepted = r.json().get("accepted", 0) if r.status_code == 200 else 0
            if r.status_code != 200:
                errors[f"HTTP {r.status_code}"] = errors.get(f"HTTP {r.status_code}", 0) + 1
            log.append((done, done - t, r.status_code, accepted))
            per_run[run_id] += accepted
            step += args.steps

    cpu: dict[str, float] = {}

    async def meter() -> None:
        # CPU the site's daphne and this bench use over the timed window: on a shared
        # machine, what the figure cost is steadier than what it reached.
        for edge, at in (("0", start + args.warmup), ("1", until)):
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            cpu["web" + edge] = loadsite.cpu_seconds(web_pid) if web_pid else float("nan")
            cpu["bench" + edge] = loadsite.cpu_seconds()

    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False, limits=limits) as client:
        await asyncio.gather(meter(), *(feed(client, run_id, token) for run_id, token in runs))
    finished = time.perf_counter()

    t0, t1 = start + args.warmup, start + args.warmup + args.seconds
    timed = [r for r in log if t0 <= r[0] < t1]
    rates = windows(log, t0, t1, min(WINDOW_S, args.seconds))
    points = sum(r[3] for r in timed)
    return {
        "runs": len(runs),
        "points_per_request": args.series * args.steps,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "requests": len(timed),
        "points": points,
        "points_per_s": points / args.seconds,
        "web_cores": (cpu["web1"] - cpu["web0"]) / args.seconds,
        "bench_cores": (cpu["bench1"] - cpu["bench0"]) / args.seconds,
        "web_cpu_ms_per_1000_points": (cpu["web1"] - cpu["web0"]) / points * 1e6 if points else float("nan"),
        "window_points_per_s": rates,
        "latency": loadsite.summary([r[1] for r in timed]),
        "errors": errors,
        "accepted_total": sum(per_run.values()),
        "per_run_points": per_run,
        "tail_s": finished - t1,
    }


def stored(run_ids: list[int]) -> tuple[int, int]:
    """Points stored for these runs, and the points their narrowest rollup level counts."""
    from django.db.models import Sum

    from runs import rollups
    from runs.models import MetricPoint, SeriesBucket

    points = MetricPoint.objects.filter(run_id__in=run_ids).count()
    counted = SeriesBucket.objects.filter(run_id__in=run_ids, width=rollups.WIDTHS[0]).aggregate(n=Sum("n"))["n"]
    return points, counted or 0


class StatementTimer:
    """A Django execute wrapper: wall time per SQL statement, grouped by its opening
    words (what the database spends of a request, statement by statement)."""

    def __init__(self) -> None:
        self.by_kind: dict[str, list[float]] = {}

    def __call__(self, execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            # Savepoint names differ per call: one row for all of them.
            kind = re.sub(r'"s\d+_x\d+"', '"s…"', re.sub(r"\s+", " ", sql).strip())[:90]
            self.by_kind.setdefault(kind, []).append(time.perf_counter() - t)


def profile(requests: int, run_id: int, token: str, names: list[str], steps: int, first_step: int) -> dict:
    """Time `requests` ingest requests in this process under cProfile (Django's test
    client: the same middleware, view, database and channel layer as the site, without
    daphne and the network). Each request gives its database connection back at its end,
    as the site's do: to the pool (DATABASE_POOL_SIZE), or closed without one (the test
    client alone would keep one open)."""
    from django.db import close_old_connections, connection
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    headers = {"Authorization": f"Bearer {token}"}
    bodies = [batch(names, first_step + k * steps, steps) for k in range(requests)]
    profiler, statements = cProfile.Profile(), StatementTimer()
    started, cpu = time.perf_counter(), time.process_time()
    with connection.execute_wrapper(statements):
        profiler.enable()
        for body in bodies:
            close_old_connections()
            r = client.post(f"/api/runs/{run_id}/metrics", data=body, content_type="application/json", headers=headers)
            close_old_connections()
            if r.status_code != 200:
                profiler.disable()
                sys.exit(f"the profiled ingest answered HTTP {r.status_code}: {r.content[:300]!r}")
        profiler.disable()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    stats = pstats.Stats(profiler)
    phases = []
    for label, where, name in PHASES:
        total = sum(
            ct for (path, _, func), (_, _, _, ct, _) in stats.stats.items() if func == name and path.endswith(where)
        )
        phases.append((label, total / requests))
    top = sorted(
        (
            (ct / requests, f"{path.split('site-packages/')[-1].split(str(loadsite.REPO) + '/')[-1]}:{func}")
            for (path, _, func), (_, _, _, ct, _) in stats.stats.items()
            if "django/test/" not in path
        ),
        reverse=True,
    )
    sql = sorted(
        ((sum(ts) / requests, len(ts) / requests, kind) for kind, ts in statements.by_kind.items()), reverse=True
    )
    return {
        "requests": requests,
        "per_request_s": wall / requests,
        "cpu_per_request_s": cpu / requests,
        "phases": phases,
        "top": top[:40],
        "sql": sql,
    }


def report(r: dict) -> None:
    print(
        f"{r['runs']} runs × {r['points_per_request']} points per request, {r['seconds']:.0f} s timed "
        f"after {r['warmup']:.0f} s warm-up: {r['requests']} requests, {r['points']} points"
    )
    verdict = "PASS" if r["points_per_s"] >= TARGET_POINTS_PER_S else "FAIL"
    print(f"accepted points/s: {r['points_per_s']:,.0f}  (target ≥ {TARGET_POINTS_PER_S:,}: {verdict})")
    width = min(WINDOW_S, r["seconds"])
    print(f"per {width:g} s window: " + "  ".join(f"{x:,.0f}" for x in r["window_points_per_s"]))
    print(f"request latency: {loadsite.ms(r['latency'])}")
    print(f"errors: {r['errors'] or 'none'}")
    if r["web_cores"] == r["web_cores"]:  # not nan: the bench started daphne and could watch it
        print(
            f"CPU over the timed window: daphne {r['web_cores']:.2f} cores "
            f"({r['web_cpu_ms_per_1000_points']:.0f} ms per 1,000 points), this bench {r['bench_cores']:.2f} cores, "
            "PostgreSQL not counted"
        )
    per_run = list(r["per_run_points"].values())
    print(f"points per run (all, warm-up included): min {min(per_run):,}  max {max(per_run):,}")


def report_profile(p: dict, points_per_request: int) -> None:
    per = p["per_request_s"]
    print(
        f"in-process profile of {p['requests']} requests ({points_per_request} points each): "
        f"{per * 1000:.1f} ms per request under cProfile → {points_per_request / per:,.0f} points/s for one thread"
    )
    print(
        f"  of which this process's CPU (Python: Django, psycopg, the rollups' merging, JSON; cProfile's own "
        f"overhead included): {p['cpu_per_request_s'] * 1000:.1f} ms; the rest waits on PostgreSQL and Redis"
    )
    for label, s in p["phases"]:
        print(f"  {label:<40} {s * 1000:7.2f} ms")
    print("  SQL statements (ms per request, statements per request, statement):")
    for total, count, kind in p["sql"][:12]:
        print(f"    {total * 1000:7.2f}  {count:4.1f}×  {kind}")
    print("  top of the profile (cumulative ms per request):")
    for s, where in p["top"][:25]:
        print(f"    {s * 1000:7.2f}  {where}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="runs posting at once")
    p.add_argument("--seconds", type=float, default=60, help="timed seconds (after --warmup)")
    p.add_argument("--warmup", type=float, default=5, help="seconds of load before timing starts")
    p.add_argument("--series", type=int, default=30, help="series per step")
    p.add_argument("--steps", type=int, default=5, help="steps per request")
    p.add_argument("--profile", type=int, default=100, help="requests to profile in-process afterwards (0: none)")
    p.add_argument("--json", help="also write the figures to this file")
    loadsite.add_site_args(p)
    args = p.parse_args()
    loadsite.require_positive(p, args, "runs", "seconds", "series", "steps")
    if args.warmup < 0 or args.profile < 0:
        p.error("--warmup and --profile must be ≥ 0")
    if args.series * args.steps > 50_000:
        p.error("--series × --steps must be ≤ 50,000 (the ingest's limit per request)")
    home, settings, _, experiment = loadsite.prepare(p, args, "bench-ingest")
    stamp = time.strftime("%H:%M:%S")
    runs = [loadsite.new_run(experiment, f"ingest load {stamp} #{i}") for i in range(args.runs)]
    ids = [run.pk for run in runs]
    site = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            site = loadsite.Site(home, settings).start_web()
            url = site.url
        print(f"site {url} ({'given' if args.url else 'daphne started here'}), runs {ids[0]}…{ids[-1]}")
        print(loadsite.load_line() + " (shared machine: other work runs beside the bench)")
        web_pid = site.processes().get("web") if site else None
        figures = asyncio.run(load(args, url, [(run.pk, run.ingest_token) for run in runs], web_pid))
        report(figures)
        print(loadsite.load_line())
        points, counted = stored(ids)
        figures["stored"], figures["rollup_counted"] = points, counted
        ok = points == figures["accepted_total"] == counted
        print(
            f"database: {points:,} points stored, {counted:,} counted by the rollups, "
            f"{figures['accepted_total']:,} accepted: {'consistent' if ok else 'MISMATCH'}"
        )
        if args.profile:
            names = series_names(args.series)
            after = figures["per_run_points"][ids[0]] // args.series  # the first step not yet posted
            prof = profile(args.profile, ids[0], runs[0].ingest_token, names, args.steps, after)
            report_profile(prof, args.series * args.steps)
            figures["profile"] = {k: v for k, v in prof.items() if k != "top"}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=2)
    finally:
        if site is not None:
            site.stop()
        if not args.keep:
            loadsite.delete_runs(ids)
    if figures["errors"] or not ok:
        sys.exit(1)
    loadsite.remove_home(home, args.keep)


if __name__ == "__main__":
    main()
