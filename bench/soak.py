"""Soak: the whole product (`manage.py up`: Ray head, Celery worker and beat, daphne) for
MINUTES with a real tiny run training through it, VIEWERS WebSocket viewers on the
run's page, a steady synthetic ingest into a second run (--extra-points-per-s) and the
pages' API reads every few seconds (the run page's /api/runs/<id> and its metrics, the
compare page's /api/compare). Every --interval seconds it samples:

- RSS and open file descriptors of the web (daphne) and worker (Celery) processes, and
  the RSS of everything in the Ray head's session (raylet, GCS, the run's actors);
- the site's PostgreSQL connections (pg_stat_activity, the bench's own left out);
- Redis memory (the whole server: shared with whatever else uses it) and the keys in
  the channel layer's database;
- points/s stored (the real run's and in all), WebSocket messages received;
- the run page's API latency (median of the reads since the last sample): the run
  (/api/runs/<id>) and its metrics (/api/runs/<id>/metrics, every series, as the page
  loads them), and the compare page's tables (/api/compare).

It prints one row per sample as it goes, then the drift (first sample vs last, and per
minute). The run is launched with stop.max_steps large and stop.max_minutes past the
soak, and cancelled at the end. Beside it, every --churn-every seconds a second tiny
run is launched and cancelled (queued, warming up or training: wherever it got to in
--churn-hold seconds), back to back, so the samples also show what launches and cancels
leave behind; each churned run must end `cancelled` with none of its Ray processes left.
Exits non-zero if the run failed, a churned run did not end cancelled, a viewer lost a
points message another viewer received or a request failed.

    DATABASE_URL=postgres://root@127.0.0.1:5432/bench REDIS_URL=redis://127.0.0.1:6379/11 \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/soak.py   # 30 min
    .venv/bin/python bench/soak.py --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import loadsite

# A tiny torch-backend run (the integration tests' size): a run step takes about a
# second on two cores, so it posts points the whole soak through.
TINY = {
    "inference": {"backend": "torch"},
    # A policy that answers at all is enough here: the default 200 noisy steps of the
    # warm start would cost about 10 s of CPU before the first step.
    "warm_start": {"steps": 20, "noisy_steps": 0},
    "trainer": {"batch_groups": 4, "group_size": 4},
}
TERMINAL = {"succeeded", "failed", "cancelled"}


class Sample(NamedTuple):
    t_min: float
    web_rss_mb: float
    worker_rss_mb: float
    ray_rss_mb: float
    ray_procs: int
    web_fds: int
    worker_fds: int
    db_conns: int
    redis_mb: float
    redis_keys: int
    run_pts_s: float
    all_pts_s: float
    ws_msgs: int
    run_ms: float
    metrics_ms: float
    compare_ms: float


COLUMNS = (
    ("t_min", "min", "{:5.1f}"),
    ("web_rss_mb", "web MB", "{:7.1f}"),
    ("worker_rss_mb", "wrk MB", "{:7.1f}"),
    ("ray_rss_mb", "ray MB", "{:7.0f}"),
    ("ray_procs", "ray n", "{:5d}"),
    ("web_fds", "web fd", "{:6d}"),
    ("worker_fds", "wrk fd", "{:6d}"),
    ("db_conns", "db conn", "{:7d}"),
    ("redis_mb", "redis MB", "{:8.2f}"),
    ("redis_keys", "keys", "{:5d}"),
    ("run_pts_s", "run pt/s", "{:8.1f}"),
    ("all_pts_s", "all pt/s", "{:8.1f}"),
    ("ws_msgs", "ws msgs", "{:7d}"),
    ("run_ms", "run ms", "{:7.1f}"),
    ("metrics_ms", "mtr ms", "{:7.1f}"),
    ("compare_ms", "cmp ms", "{:7.1f}"),
)


def header() -> str:
    return " ".join(f"{title:>{len(fmt.format(0))}}" for _, title, fmt in COLUMNS)


def row(s: Sample) -> str:
    return " ".join(fmt.format(getattr(s, key)) for key, _, fmt in COLUMNS)


def drift(samples: list[Sample]) -> list[tuple[str, float, float, float, float]]:
    """(column, first, last, last − first, per minute) for each sampled figure."""
    first, last = samples[0], samples[-1]
    minutes = last.t_min - first.t_min
    out = []
    for key, title, _ in COLUMNS[1:]:
        a, b = float(getattr(first, key)), float(getattr(last, key))
        out.append((title, a, b, b - a, (b - a) / minutes if minutes > 0 else float("nan")))
    return out


class Probe:
    """The sync half of sampling (psutil, the database, Redis), on one thread of its
    own, so this process holds one database connection, left out of the count."""

    def __init__(self, site: loadsite.Site, redis_url: str, run_ids: tuple[int, int]):
        import redis

        self.site = site
        self.redis = redis.Redis.from_url(redis_url)
        self.run_ids = run_ids
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
        self.last: tuple[float, int, int] | None = None
        # The Ray session's processes at the first and the latest sample: which grew.
        self.ray_first: dict[int, tuple[str, float]] = {}
        self.ray_last: dict[int, tuple[str, float]] = {}

    def _rss_fds(self, pid: int | None) -> tuple[float, int]:
        import psutil

        if pid is None:
            return float("nan"), -1
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            return p.memory_info().rss / 2**20, p.num_fds()
        return float("nan"), -1

    def _session(self, sid: int | None) -> dict[int, tuple[str, float]]:
        """pid → (process title, RSS MB) of every process in session `sid`: the Ray
        head's raylet, GCS and agents, and the run's actors (their titles name them)."""
        import psutil

        out = {}
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                if sid is not None and os.getsid(p.pid) == sid:
                    title = (p.cmdline() or [p.name()])[0].split("/")[-1][:40]
                    out[p.pid] = (title, p.memory_info().rss / 2**20)
        return out

    def _points(self) -> tuple[int, int]:
        from django.db import connection

        with connection.cursor() as c:
            c.execute(
                "SELECT count(*) FILTER (WHERE run_id = %s), count(*) FROM runs_metricpoint WHERE run_id IN (%s, %s)",
                [self.run_ids[0], *self.run_ids],
            )
            return c.fetchone()

    def _db_conns(self) -> int:
        from django.db import connection

        with connection.cursor() as c:
            c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return c.fetchone()[0]

    def sample_sync(self) -> dict:
        pids = self.site.processes()
        ray = self._session(pids.get("ray"))
        self.ray_first = self.ray_first or ray
        self.ray_last = ray
        web_rss, web_fds = self._rss_fds(pids.get("web"))
        worker_rss, worker_fds = self._rss_fds(pids.get("worker"))
        now = time.monotonic()
        run_points, all_points = self._points()
        if self.last is None:
            run_rate = all_rate = float("nan")
        else:
            dt = now - self.last[0]
            run_rate, all_rate = (run_points - self.last[1]) / dt, (all_points - self.last[2]) / dt
        self.last = (now, run_points, all_points)
        return {
            "web_rss_mb": web_rss,
            "worker_rss_mb": worker_rss,
            "ray_rss_mb": sum(mb for _, mb in ray.values()),
            "ray_procs": len(ray),
            "web_fds": web_fds,
            "worker_fds": worker_fds,
            "db_conns": self._db_conns(),
            "redis_mb": self.redis.info("memory")["used_memory"] / 2**20,
            "redis_keys": self.redis.dbsize(),
            "run_pts_s": run_rate,
            "all_pts_s": all_rate,
        }

    async def sample(self) -> dict:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.sample_sync)


def ray_growth(first: dict[int, tuple[str, float]], last: dict[int, tuple[str, float]]) -> list[tuple]:
    """(pid, title, first MB, last MB) of the Ray processes alive at both samples, the
    most grown first; then those that came or went (first or last MB is None)."""
    both = [(pid, last[pid][0], first[pid][1], last[pid][1]) for pid in first.keys() & last.keys()]
    both.sort(key=lambda r: r[3] - r[2], reverse=True)
    came = [(pid, last[pid][0], None, last[pid][1]) for pid in last.keys() - first.keys()]
    went = [(pid, first[pid][0], first[pid][1], None) for pid in first.keys() - last.keys()]
    return both + came + went


def lost_frames(frames: list[list[int]]) -> dict[int, int]:
    """Per viewer (by index), how many points messages another viewer received that it did
    not, while both were reading.

    The site sends every viewer of a run the same messages in the same order (encoded
    once, handed to each socket), so between the first and the last message two viewers
    both received, their sequences agree: a message in one and not the other there was
    lost. Before the first common message one of them had not joined yet, after the last
    one had stopped reading. (Steps cannot say this: a message holds one actor's points
    over several steps, so a viewer that joins between two actors' messages of the same
    steps has fewer points of them without having lost any.) Two viewers with nothing in
    common (one received nothing) each lost all the other received."""
    lacked: dict[int, set[int]] = {i: set() for i in range(len(frames))}
    for a, mine in enumerate(frames):
        for b, theirs in enumerate(frames):
            if a == b:
                continue
            have = set(mine)
            common = [k for k, f in enumerate(theirs) if f in have]
            window = theirs[common[0] : common[-1] + 1] if common else theirs
            lacked[a] |= {f for f in window if f not in have}
    return {i: len(missed) for i, missed in lacked.items() if missed}


def _median_ms(reads: list[tuple[float, float]], since: float, until: float) -> float:
    """Median of the reads that finished in (since, until], else the latest one."""
    window = [took for at, took in reads if since < at <= until] or [took for _, took in reads[-1:]]
    return statistics.median(window) * 1000 if window else float("nan")


async def soak(args, site: loadsite.Site, probe: Probe, cookies: dict, run_id: int, synthetic) -> dict:
    import httpx

    url = site.url
    stop = asyncio.Event()
    viewers = [loadsite.Viewer(i) for i in range(args.viewers)]
    gate = asyncio.Semaphore(10)
    watchers = [
        asyncio.ensure_future(v.watch(loadsite.ws_url(url, run_id), cookies["sessionid"], url, gate, stop))
        for v in viewers
    ]
    reads: dict[str, list[tuple[float, float]]] = {"run": [], "metrics": [], "compare": []}
    errors: dict[str, int] = {}

    def failed(what: str) -> None:
        errors[what] = errors.get(what, 0) + 1

    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False, cookies=cookies) as client:

        async def read_pages() -> None:
            # What the run page asks when it loads, then the compare page's tables.
            asks = (
                ("run", f"/api/runs/{run_id}", None),
                ("metrics", f"/api/runs/{run_id}/metrics", None),
                ("compare", "/api/compare", {"runs": f"{run_id},{synthetic.pk}", "series": ""}),
            )
            while not stop.is_set():
                for name, path, params in asks:
                    t = time.perf_counter()
                    r = await client.get(path, params=params)
                    reads[name].append((time.monotonic(), time.perf_counter() - t))
                    if r.status_code != 200:
                        failed(f"GET {name} HTTP {r.status_code}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.read_every)

        async def feed_synthetic() -> None:
            # A steady second source: 30 series per step, enough steps per second for the rate.
            from ingest_load import batch, series_names

            names = series_names(30)
            steps = max(1, round(args.extra_points_per_s / len(names)))
            headers = {"Authorization": f"Bearer {synthetic.ingest_token}", "Content-Type": "application/json"}
            step, tick = 0, time.monotonic()
            while not stop.is_set():
                try:
                    r = await client.post(
                        f"/api/runs/{synthetic.pk}/metrics", content=batch(names, step, steps), headers=headers
                    )
                    if r.status_code != 200:
                        failed(f"POST metrics HTTP {r.status_code}")
                except httpx.HTTPError as exc:
                    failed(f"POST metrics {type(exc).__name__}")
                step += steps
                tick += 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, tick - time.monotonic()))

        churned: list[dict] = []

        async def churn() -> None:
            # Back-to-back launches and cancels beside the long run: each churned run is
            # held --churn-hold seconds (noting the furthest it got: queued, running and
            # its phase), cancelled, and waited for until it ends. A cycle begun is
            # finished even when the soak stops, so no churned run is left behind.
            csrf = {"X-CSRFToken": cookies["csrftoken"]}
            while not stop.is_set():
                cycle = time.monotonic()
                r = await client.post("/api/runs", json=launch_body("churn", 5), headers=csrf)
                if r.status_code != 201:
                    failed(f"churn launch HTTP {r.status_code}")
                else:
                    run = r.json()["id"]
                    reached = "queued"
                    hold_end = cycle + args.churn_hold
                    while not stop.is_set() and time.monotonic() < hold_end:
                        got = (await client.get(f"/api/runs/{run}")).json()
                        reached = f"{got['status']} {got.get('phase', '')}".strip()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), 2.0)
                    asked = time.monotonic()
                    await client.post(f"/api/runs/{run}/cancel", json={}, headers=csrf)
                    status = ""
                    while time.monotonic() - asked < 120:
                        status = (await client.get(f"/api/runs/{run}")).json()["status"]
                        if status in TERMINAL:
                            break
                        await asyncio.sleep(1)
                    churned.append(
                        {"id": run, "reached": reached, "status": status, "cancel_s": time.monotonic() - asked}
                    )
                    if status != "cancelled":
                        failed(f"churned run ended {status or 'not at all'}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, cycle + args.churn_every - time.monotonic()))

        background = [asyncio.ensure_future(read_pages())]
        if args.extra_points_per_s > 0:
            background.append(asyncio.ensure_future(feed_synthetic()))
        if args.churn_every > 0:
            background.append(asyncio.ensure_future(churn()))

        await asyncio.gather(*(v.opened() for v in viewers))
        await probe.sample()  # the baseline the first sample's points/s count from
        probe.ray_first = {}
        samples: list[Sample] = []
        start = time.monotonic()
        # A sample every --interval seconds over --minutes, so their number is fixed by the
        # flags: a sample that ends late (a loaded host) makes the next one come at once
        # rather than being skipped.
        count = samples_in(args.minutes, args.interval)
        last_msgs, last_t = 0, start
        print(header(), flush=True)
        for k in range(1, count + 1):
            await asyncio.sleep(max(0.0, start + k * args.interval - time.monotonic()))
            figures = await probe.sample()
            now = time.monotonic()
            msgs = sum(v.messages for v in viewers)
            s = Sample(
                t_min=(now - start) / 60,
                ws_msgs=msgs - last_msgs,
                run_ms=_median_ms(reads["run"], last_t, now),
                metrics_ms=_median_ms(reads["metrics"], last_t, now),
                compare_ms=_median_ms(reads["compare"], last_t, now),
                **figures,
            )
            samples.append(s)
            print(row(s), flush=True)
            last_msgs, last_t = msgs, now
            if k == count:
                break
            status = (await client.get(f"/api/runs/{run_id}")).json().get("status")
            if status in TERMINAL:
                print(f"the run ended early: {status}", flush=True)
                break

        # Every viewer must have every message another received while both read (the
        # messages in flight at the end land within these seconds or count for neither).
        await asyncio.sleep(3)
        stop.set()
        await asyncio.gather(*background, *watchers)
        run = (await client.get(f"/api/runs/{run_id}")).json()
    lost = lost_frames([v.frames for v in viewers])
    points, msgs = [v.points for v in viewers], [v.messages for v in viewers]
    return {
        "samples": [s._asdict() for s in samples],
        "churned": churned,
        "errors": errors,
        "run_status": run.get("status"),
        "run_error": run.get("error", ""),
        "viewer_points": {"min": min(points, default=0), "max": max(points, default=0)},
        "viewer_messages": {"min": min(msgs, default=0), "max": max(msgs, default=0)},
        "viewers_lost": lost,
        "viewers_closed": {v.index: v.closed for v in viewers if v.closed},
        "ages": loadsite.summary([a for v in viewers for a in v.ages]),
        "run_reads": loadsite.summary([x for _, x in reads["run"]]),
        "metrics_reads": loadsite.summary([x for _, x in reads["metrics"]]),
        "compare_reads": loadsite.summary([x for _, x in reads["compare"]]),
        "_samples": samples,
        "ray_growth": ray_growth(probe.ray_first, probe.ray_last),
    }


def samples_in(minutes: float, interval_s: float) -> int:
    """How many samples a soak of `minutes` takes, one every `interval_s` seconds (the
    first one interval after the start; the flags check that at least one fits)."""
    return max(1, math.floor(minutes * 60 / interval_s + 1e-9))


def launch_body(name: str, minutes: float) -> dict:
    """POST /api/runs for a tiny run that stops after `minutes` at the latest."""
    overrides = {**TINY, "stop": {"max_steps": 100_000, "max_minutes": math.ceil(minutes)}}
    return {
        "team": "bench-load",
        "name": f"{name} {time.strftime('%H:%M:%S')}",
        "preset": "async",
        "overrides": overrides,
    }


def launch(url: str, cookies: dict, minutes: float) -> int:
    import httpx

    with httpx.Client(base_url=url, timeout=60, trust_env=False, cookies=cookies) as client:
        r = client.post(
            "/api/runs", json=launch_body("soak", minutes + 10), headers={"X-CSRFToken": cookies["csrftoken"]}
        )
        if r.status_code != 201:
            sys.exit(f"the launch was refused: HTTP {r.status_code} {r.text[:500]}")
        return r.json()["id"]


def wait_first_step(url: str, cookies: dict, run_id: int, timeout_s: float) -> float:
    """Seconds until the run reported its first trained step (policy/version)."""
    import httpx

    t0 = time.monotonic()
    seen = ""
    with httpx.Client(base_url=url, timeout=60, trust_env=False, cookies=cookies) as client:
        while time.monotonic() - t0 < timeout_s:
            run = client.get(f"/api/runs/{run_id}").json()
            where = f"{run['status']} {run.get('phase', '')}".strip()
            if where != seen:  # each phase once, not every progress line of the warm start
                detail = run.get("phase_detail", "")
                print(f"  {time.monotonic() - t0:5.0f} s  run {run_id}: {where} {detail}", flush=True)
                seen = where
            if run["status"] in TERMINAL:
                sys.exit(f"the run ended before its first step: {run['status']} {run.get('error', '')}")
            data = client.get(f"/api/runs/{run_id}/metrics", params={"series": "policy/version"}).json()
            if data["series"].get("policy/version", {}).get("steps"):
                return time.monotonic() - t0
            time.sleep(2)
    sys.exit(f"run {run_id} reported no step within {timeout_s:.0f} s")


def cancel(url: str, cookies: dict, run_id: int, timeout_s: float = 120) -> str:
    import httpx

    with httpx.Client(base_url=url, timeout=60, trust_env=False, cookies=cookies) as client:
        client.post(f"/api/runs/{run_id}/cancel", json={}, headers={"X-CSRFToken": cookies["csrftoken"]})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = client.get(f"/api/runs/{run_id}").json()["status"]
            if status in TERMINAL:
                return status
            time.sleep(1)
        return status


def report(r: dict) -> None:
    print("drift (first sample → last):")
    print(f"  {'':10} {'first':>10} {'last':>10} {'change':>10} {'per min':>10}")
    for title, a, b, d, per in drift(r["_samples"]):
        print(f"  {title:10} {a:10.1f} {b:10.1f} {d:+10.1f} {per:+10.2f}")
    print("Ray processes that grew most (RSS MB, first sample → last):")
    for pid, title, a, b in r["ray_growth"][:6]:
        change = f"{b - a:+.1f}" if a is not None and b is not None else ("came" if a is None else "went")
        mb = ["-" if x is None else f"{x:.1f}" for x in (a, b)]
        print(f"  {pid:>8} {title:<40} {mb[0]:>8} → {mb[1]:>8}  {change}")
    print(f"run page API, the run:      {loadsite.ms(r['run_reads'], ('p50', 'p95', 'max'))}")
    print(f"run page API, its metrics:  {loadsite.ms(r['metrics_reads'], ('p50', 'p95', 'max'))}")
    print(f"compare API (2 runs' tables): {loadsite.ms(r['compare_reads'], ('p50', 'p95', 'max'))}")
    print(f"age of the newest point on receipt (engine time → viewer): {loadsite.ms(r['ages'], ('p50', 'p95', 'max'))}")
    v, m = r["viewer_points"], r["viewer_messages"]
    print(f"points per viewer: min {v['min']}  max {v['max']}; messages: min {m['min']}  max {m['max']}")
    for index, missed in list(r["viewers_lost"].items())[:10]:
        print(f"  viewer {index} lost {missed} messages another viewer received while both read")
    for index, why in list(r["viewers_closed"].items())[:10]:
        print(f"  viewer {index} {why}")
    churned = r["churned"]
    if churned:
        took = loadsite.summary([c["cancel_s"] for c in churned])
        reached: dict[str, int] = {}
        for c in churned:
            reached[c["reached"]] = reached.get(c["reached"], 0) + 1
        ended = sum(c["status"] == "cancelled" for c in churned)
        print(
            f"churn: {len(churned)} runs launched and cancelled, {ended} ended cancelled; cancel → ended "
            + "  ".join(f"{k} {took[k]:.1f} s" for k in ("p50", "p95", "max"))
        )
        print("  where they were when cancelled: " + ", ".join(f"{k} ×{n}" for k, n in sorted(reached.items())))
    print(f"errors: {r['errors'] or 'none'}")
    print(f"run status at the end of the soak: {r['run_status']} {r['run_error']}".rstrip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30, help="how long to sample once the run trains")
    p.add_argument("--interval", type=float, default=30, help="seconds between samples")
    p.add_argument("--viewers", type=int, default=20, help="WebSocket viewers on the run's page")
    p.add_argument("--extra-points-per-s", type=float, default=300, help="synthetic ingest into a second run (0: none)")
    p.add_argument("--read-every", type=float, default=5, help="seconds between the pages' API reads")
    p.add_argument("--churn-every", type=float, default=60, help="seconds between churned launches (0: none)")
    p.add_argument("--churn-hold", type=float, default=20, help="seconds a churned run lives before its cancel")
    p.add_argument("--start-timeout", type=float, default=900, help="seconds the run may take to its first step")
    p.add_argument("--json", help="also write the samples and figures to this file")
    loadsite.add_site_args(p, url=False)
    args = p.parse_args()
    loadsite.require_positive(p, args, "minutes", "interval", "read_every", "start_timeout")
    if args.viewers < 0 or args.extra_points_per_s < 0 or args.churn_every < 0 or args.churn_hold < 0:
        p.error("--viewers, --extra-points-per-s, --churn-every and --churn-hold must be ≥ 0")
    if args.interval > args.minutes * 60:
        p.error(f"--interval ({args.interval:g} s) must fit in --minutes ({args.minutes:g} min)")
    home, settings, user, experiment = loadsite.prepare(p, args, "bench-soak")
    # Finished, so neither the queue nor reconcile counts it: only its points matter. Its
    # ingest token must outlive the soak, past the grace a finished run's token gets.
    synthetic = loadsite.new_run(experiment, f"soak synthetic {time.strftime('%H:%M:%S')}", status="succeeded")
    settings.setdefault("ROLLWAY_INGEST_TOKEN_GRACE_S", str(math.ceil(args.minutes * 60) + 3600))
    ids = [synthetic.pk]
    site = None
    try:
        print(loadsite.load_line() + " (shared machine: other work runs beside the bench)", flush=True)
        t0 = time.monotonic()
        site = loadsite.Site(home, settings).start_up()
        print(f"site {site.url} up in {time.monotonic() - t0:.0f} s (manage.py up; log {site.log_path})", flush=True)
        cookies = loadsite.login_cookies(site.url, user.username)
        run_id = launch(site.url, cookies, args.minutes)
        ids.append(run_id)
        print(f"run {run_id} launched (tiny, torch backend); waiting for its first step", flush=True)
        took = wait_first_step(site.url, cookies, run_id, args.start_timeout)
        print(f"first step after {took:.0f} s; sampling every {args.interval:g} s for {args.minutes:g} min", flush=True)
        probe = Probe(site, args.redis_url, (run_id, synthetic.pk))
        figures = asyncio.run(soak(args, site, probe, cookies, run_id, synthetic))
        ids.extend(c["id"] for c in figures["churned"])
        report(figures)
        print(loadsite.load_line())
        print(f"run {run_id} cancelled at the end: {cancel(site.url, cookies, run_id)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({k: v for k, v in figures.items() if not k.startswith("_")}, f, indent=2)
    finally:
        if site is not None:
            site.stop()
        if not args.keep:
            loadsite.delete_runs(ids)
    lost = figures["viewers_lost"] or figures["viewers_closed"]
    if figures["run_status"] in ("failed", "cancelled") or figures["errors"] or lost:
        sys.exit(1)
    loadsite.remove_home(home, args.keep)


if __name__ == "__main__":
    main()
