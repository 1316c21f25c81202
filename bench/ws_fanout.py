"""WebSocket fan-out: one live run, N viewers on its page's socket (/ws/runs/<id>/), the
ingest fed at a steady rate. Each post is one step of SERIES points stamped with the
emit time (their `time` field, set just before the POST); each viewer records, per
point, receipt time − emit time. Prints p50/p95/p99/max of that latency (target p95 <
250 ms at 200 viewers), messages received per viewer, and every viewer that missed
points, with the steps it missed.

It starts its own site (daphne on a free port, the Redis channel layer) on the
PostgreSQL database given, creates the run there and logs a bench user in through the
login form; with --url it uses a running site instead (--database-url must be that
site's database: the bench reads the run's ingest token from it).

    DATABASE_URL=postgres://root@127.0.0.1:5432/bench REDIS_URL=redis://127.0.0.1:6379/11 \\
        .venv/bin/python bench/ws_fanout.py                     # 200 viewers, 60 s at 5 posts/s
    .venv/bin/python bench/ws_fanout.py --viewers 20 --seconds 10 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import loadsite

TARGET_P95_S = 0.250
SERIES = 30  # one step of a run's metrics, as the reporter posts it


def series_names(n: int) -> list[str]:
    # Names no engine emits: a point of another run that shares the Redis database and
    # the run id is counted as foreign instead of as this run's.
    return [f"bench/fanout-{i:02d}" for i in range(n)]


def batch(names: list[str], step: int, now: float) -> dict:
    return {"points": [{"series": s, "step": step, "value": float(i), "time": now} for i, s in enumerate(names)]}


def missed(viewers: list[loadsite.Viewer], accepted: dict[int, int]) -> dict[int, list[int]]:
    """viewer index → steps it got fewer points of than the ingest accepted."""
    out = {}
    for v in viewers:
        steps = [step for step, n in accepted.items() if v.by_step.get(step, 0) < n]
        if steps:
            out[v.index] = steps
    return out


def doubled(viewers: list[loadsite.Viewer], accepted: dict[int, int]) -> dict[int, list[int]]:
    """viewer index → steps it got more points of than the ingest accepted (a message
    twice); only the timed steps, as `accepted` holds them."""
    out = {}
    for v in viewers:
        steps = [step for step, n in v.by_step.items() if step in accepted and n > accepted[step]]
        if steps:
            out[v.index] = steps
    return out


async def fanout(args, url: str, run_id: int, token: str, cookie: str, web_pid: int | None = None) -> dict:
    import httpx

    def web_cpu_s() -> float:
        return loadsite.cpu_seconds(web_pid) if web_pid else float("nan")

    names = series_names(args.series)
    watched = frozenset(names)
    viewers = [loadsite.Viewer(i) for i in range(args.viewers)]
    stop, lag_stop, lag = asyncio.Event(), asyncio.Event(), [0.0]
    gate = asyncio.Semaphore(args.connect_concurrency)
    ws = loadsite.ws_url(url, run_id)
    started = time.perf_counter()
    tasks = [asyncio.ensure_future(v.watch(ws, cookie, url, gate, stop, watched)) for v in viewers]

    await asyncio.gather(*(v.opened() for v in viewers))
    connect_s = time.perf_counter() - started
    refused = [v for v in viewers if not v.connected.is_set()]
    print(f"{len(viewers) - len(refused)} viewers connected in {connect_s:.1f} s ({len(refused)} failed)")
    for v in refused[:5]:
        print(f"  viewer {v.index}: {v.closed}")

    lag_task = asyncio.ensure_future(loadsite.loop_lag(lag_stop, lag))
    accepted: dict[int, int] = {}
    emitted: dict[int, float] = {}  # step → its points' `time`, stamped just before the POST
    answered: dict[int, float] = {}  # step → when the ingest's answer arrived
    post_s: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=32)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False, limits=limits, headers=headers) as client:

        async def post(step: int) -> None:
            emitted[step] = time.time()
            body = json.dumps(batch(names, step, emitted[step]))
            t = time.perf_counter()
            try:
                r = await client.post(
                    f"/api/runs/{run_id}/metrics", content=body, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            post_s.append(time.perf_counter() - t)
            answered[step] = time.time()
            if r.status_code == 200:
                accepted[step] = r.json()["accepted"]
            else:
                errors[f"HTTP {r.status_code}"] = errors.get(f"HTTP {r.status_code}", 0) + 1

        # Warm-up: step 0 proves every viewer has joined the run's group before timing starts.
        await post(0)
        live = [v for v in viewers if v.connected.is_set()]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(0 in v.by_step for v in live if not v.failed.is_set()):
            await asyncio.sleep(0.05)
        late = [v.index for v in live if 0 not in v.by_step]
        if late:
            print(f"warm-up point never reached {len(late)} viewers: {late[:10]}")
        accepted.pop(0, None)
        post_s.clear()

        steps = max(1, round(args.seconds * args.rate))
        t0, cpu0, own0 = time.perf_counter(), web_cpu_s(), loadsite.cpu_seconds()
        posts = []
        for k in range(steps):
            delay = t0 + k / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            posts.append(asyncio.ensure_future(post(k + 1)))
        await asyncio.gather(*posts)
        emit_s = time.perf_counter() - t0

    # Let the last messages arrive: done when every viewer has every accepted point.
    deadline = time.monotonic() + args.drain
    while time.monotonic() < deadline and missed(live, accepted):
        await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - t0
    web_cpu, own_cpu = web_cpu_s() - cpu0, loadsite.cpu_seconds() - own0
    lag_stop.set()
    stop.set()
    await asyncio.gather(*tasks, lag_task)

    measured = set(accepted)
    latencies = [lat for v in live for step, lat in v.latency_by_step.items() if step in measured]
    # The ingest answers after the commit and the channel-layer send: what is left of a
    # latency after the answer is the fan-out's own (negative: a viewer was faster).
    after_answer = [
        emitted[step] + lat - answered[step]
        for v in live
        for step, lat in v.latency_by_step.items()
        if step in measured
    ]
    per_viewer = [sum(1 for s in v.by_step if s in measured) for v in live]
    return {
        "viewers": args.viewers,
        "connected": len(live),
        "connect_s": connect_s,
        "posts": steps,
        "accepted_posts": len(accepted),
        "points_per_post": args.series,
        "emit_s": emit_s,
        "rate": steps / emit_s,
        "post": loadsite.summary(post_s),
        "errors": errors,
        "latency": loadsite.summary(latencies),
        "after_answer": loadsite.summary(after_answer),
        "deliveries": len(latencies),
        "messages_per_viewer": {
            "min": min(per_viewer, default=0),
            "median": statistics.median(per_viewer) if per_viewer else 0,
            "max": max(per_viewer, default=0),
        },
        "missed": missed(live, accepted),
        "doubled": doubled(live, accepted),
        "early_close": {v.index: v.closed for v in live if v.closed},
        "foreign_points": sum(v.foreign for v in viewers),
        "loop_lag_max_s": lag[0],
        "web_cores": web_cpu / elapsed,
        "bench_cores": own_cpu / elapsed,
        # Every message a viewer got in the timed span (all of them, whatever the step).
        "web_cpu_ms_per_message": web_cpu * 1000 / max(1, sum(len(v.latency_by_step) for v in live)),
    }


def report(r: dict) -> None:
    print(
        f"posted {r['posts']} batches × {r['points_per_post']} points at {r['rate']:.1f}/s over "
        f"{r['emit_s']:.1f} s: ingest {loadsite.ms(r['post'], ('p50', 'p95', 'max'))}, "
        f"errors {r['errors'] or 'none'}"
    )
    lat = r["latency"]
    verdict = "PASS" if lat["p95"] < TARGET_P95_S else "FAIL"
    print(
        f"emit→receive latency over {r['deliveries']} deliveries ({r['connected']} viewers × "
        f"{r['accepted_posts']} batches): {loadsite.ms(lat)}  (target p95 < 250 ms: {verdict})"
    )
    print(f"  of which after the ingest answered (the fan-out alone): {loadsite.ms(r['after_answer'])}")
    m = r["messages_per_viewer"]
    print(
        f"messages per viewer: min {m['min']}  median {m['median']:g}  max {m['max']}  (expected {r['accepted_posts']})"
    )
    if r["missed"]:
        print(f"viewers that missed points: {len(r['missed'])}")
        for index, steps in list(r["missed"].items())[:20]:
            print(f"  viewer {index}: {len(steps)} steps short, e.g. {steps[:8]}")
    else:
        print("viewers that missed points: none")
    if r["doubled"]:
        print(f"viewers that got a step twice: {len(r['doubled'])} (e.g. {list(r['doubled'].items())[:3]})")
    for index, why in list(r["early_close"].items())[:10]:
        print(f"  viewer {index} {why}")
    if r["foreign_points"]:
        print(f"points of other runs on the same group (shared Redis): {r['foreign_points']}")
    print(f"bench event-loop lag: max {r['loop_lag_max_s'] * 1000:.0f} ms (a floor the bench adds to any one latency)")
    if r["web_cores"] == r["web_cores"]:  # not nan: the bench started daphne and could watch it
        print(
            f"CPU from the first post to the last delivery: daphne {r['web_cores']:.2f} cores "
            f"({r['web_cpu_ms_per_message']:.2f} ms per message delivered, ingest included), "
            f"this bench {r['bench_cores']:.2f} cores"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--viewers", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60, help="how long to post")
    p.add_argument("--rate", type=float, default=5, help="posts (steps) per second")
    p.add_argument("--series", type=int, default=SERIES, help="points per post (one per series)")
    p.add_argument("--connect-concurrency", type=int, default=20, help="WebSocket handshakes in flight at once")
    p.add_argument("--drain", type=float, default=60, help="seconds to wait for late messages after the last post")
    p.add_argument("--json", help="also write the figures to this file")
    loadsite.add_site_args(p)
    args = p.parse_args()
    loadsite.require_positive(p, args, "viewers", "seconds", "rate", "series", "connect_concurrency")
    if args.series > 1000:
        p.error("--series must be ≤ 1000 (one post carries one point per series)")
    home, settings, user, experiment = loadsite.prepare(p, args, "bench-ws")
    run = loadsite.new_run(experiment, f"ws fan-out {time.strftime('%H:%M:%S')}")
    site = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            site = loadsite.Site(home, settings).start_web()
            url = site.url
        print(f"site {url} ({'given' if args.url else 'daphne started here'}), run {run.pk}")
        print(loadsite.load_line() + " (shared machine: other work runs beside the bench)")
        cookie = loadsite.session_cookie(url, user.username)
        web_pid = site.processes().get("web") if site else None
        figures = asyncio.run(fanout(args, url, run.pk, run.ingest_token, cookie, web_pid))
        report(figures)
        print(loadsite.load_line())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=2)
    finally:
        if site is not None:
            site.stop()
        if not args.keep:
            loadsite.delete_runs([run.pk])
    if figures["connected"] < args.viewers or figures["missed"] or figures["errors"]:
        sys.exit(1)
    loadsite.remove_home(home, args.keep)


if __name__ == "__main__":
    main()
