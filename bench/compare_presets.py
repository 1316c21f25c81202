"""Compare built-in presets on the default task through a running Rollway site's queue.

Launches ONE comparison (`POST /api/comparisons`) of every built-in preset (or
`--presets`) × `--seeds`, waits until each of its runs has ended (every run goes through
the run queue like any launch), then prints each run's status and duration (and the
error of a failed one) and the compare page's summary table as markdown: one row per
configuration, each cell the mean ± half the min–max range over seeds, ★ on the best per
column, numbers formatted as the page formats them.

    ROLLWAY_MAX_RUNNING=1 python manage.py up --port 8050 &
    .venv/bin/python bench/compare_presets.py --url http://127.0.0.1:8050
    .venv/bin/python bench/compare_presets.py --url http://127.0.0.1:8050 \
        --presets async,sync --seeds 0,1,2 --overrides '{"stop": {"max_steps": 100}}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

import httpx
from reward_via_platform import login, post

ACTIVE = {"starting", "running", "cancelling"}


class SiteError(Exception):
    """A refusal or an unexpected answer from the site, with its body."""


def check(r: httpx.Response, what: str) -> dict:
    if r.status_code >= 400:
        raise SiteError(f"{what}: HTTP {r.status_code} {r.text}")
    try:
        return r.json()
    except ValueError:
        raise SiteError(f"{what}: HTTP {r.status_code}, not JSON: {r.text[:300]}") from None


def pick_team(client: httpx.Client, wanted: str | None) -> dict:
    """The team to launch in: `wanted` (id, slug or name), else the user's only team,
    else the one with slug "demo"."""
    teams = check(client.get("/api/teams"), "GET /api/teams")["teams"]
    if wanted:
        found = [t for t in teams if wanted in (str(t["id"]), t["slug"], t["name"])]
    elif len(teams) == 1:
        found = teams
    else:
        found = [t for t in teams if t["slug"] == "demo"]
    if not found:
        names = ", ".join(f"{t['slug']} (id {t['id']})" for t in teams) or "none"
        raise SiteError(f"no team {wanted or 'demo'!r} among your teams: {names}; pass --team")
    return found[0]


def _digits(x: float, precision: int) -> tuple[str, int]:
    """x's `precision` significant digits (sign included) and its decimal exponent,
    rounded half away from zero on the exact binary value, as JavaScript rounds."""
    d = Decimal(x)
    e = d.adjusted()
    q = d.scaleb(-e).quantize(Decimal(1).scaleb(1 - precision), rounding=ROUND_HALF_UP)
    if abs(q) >= 10:
        e += 1
        q = d.scaleb(-e).quantize(Decimal(1).scaleb(1 - precision), rounding=ROUND_HALF_UP)
    return str(q), e


def _exponential(x: float, precision: int) -> str:
    mantissa, e = _digits(x, precision)
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def fmt(v: float | None) -> str:
    """compare.js's fmt(): integers as they are, else toExponential(3) below 1e-3 or from
    1e6 up, else toPrecision(4) (which is itself exponential from 1e4 up)."""
    if v is None:
        return "—"
    if float(v).is_integer():
        # JavaScript's String() and Python's repr() both give the shortest round trip.
        return str(int(v)) if abs(v) < 1e21 else repr(float(v))
    a = abs(v)
    if a < 1e-3 or a >= 1e6:
        return _exponential(v, 4)
    mantissa, e = _digits(v, 4)
    if e < -6 or e >= 4:
        return _exponential(v, 4)
    return f"{Decimal(mantissa).scaleb(e):.{max(0, 3 - e)}f}"


def summary_markdown(summary: dict) -> str:
    """The compare page's summary table (drawSummary in compare.js) as markdown."""
    cols = summary["columns"]
    header = ["configuration"] + [c["label"] + (" ↑" if c["better"] == "higher" else " ↓") for c in cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in summary["rows"]:
        cells = [f"{row['configuration']}: {row['label']}"]
        for col in cols:
            c = row["cells"][col["key"]]
            best = row["configuration"] in summary["best"][col["key"]]
            if c["mean"] is None:
                cells.append("—")
            else:
                cells.append(fmt(c["mean"]) + (f" ± {fmt(c['spread'])}" if c["n"] > 1 else "") + (" ★" if best else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def duration_s(run: dict) -> float | None:
    if not run.get("started_at") or not run.get("finished_at"):
        return None
    return (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()


def wait_for_runs(client: httpx.Client, comparison_id: int, *, poll_s: float, timeout_s: float) -> list[dict]:
    """Poll the comparison until every run has ended; print a line whenever the counts
    change, and at least once a minute."""
    t0 = time.monotonic()
    last_line, last_print = "", 0.0
    while True:
        try:
            runs = check(client.get(f"/api/comparisons/{comparison_id}"), "GET comparison")["runs"]
        except httpx.TransportError as exc:
            # The site may restart under a long comparison; its runs live on in Ray.
            print(f"  site not answering ({exc!r}); trying again", flush=True)
            time.sleep(poll_s)
            continue
        counts = Counter(
            "ended" if r["is_terminal"] else "running" if r["status"] in ACTIVE else r["status"] for r in runs
        )
        elapsed = time.monotonic() - t0
        line = f"queued {counts['queued']:3d}  running {counts['running']:2d}  ended {counts['ended']:3d}/{len(runs)}"
        if line != last_line or elapsed - last_print >= 60 or counts["ended"] == len(runs):
            ended = Counter(r["status"] for r in runs if r["is_terminal"])
            detail = ", ".join(f"{k} {v}" for k, v in sorted(ended.items()))
            print(f"  t={elapsed:6.0f}s  {line}  ({detail or 'none ended yet'})", flush=True)
            last_line, last_print = line, elapsed
        if counts["ended"] == len(runs):
            return runs
        if elapsed > timeout_s:
            raise SiteError(f"not every run ended within {timeout_s:.0f} s; the comparison is still on the site")
        time.sleep(poll_s)


def add_site_arguments(p: argparse.ArgumentParser, *, seeds: str) -> None:
    """The arguments every bench that launches a comparison through a site takes."""
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--user", default="demo")
    p.add_argument("--password", default="demo")
    p.add_argument("--team", default=None, help="team id, slug or name (default: your only team, or demo)")
    p.add_argument("--presets", default="", help="comma-separated preset names (default: every built-in preset)")
    p.add_argument("--seeds", default=seeds, help="comma-separated seeds")
    p.add_argument("--poll", type=float, default=15, help="seconds between polls")


def parse_seeds(raw: str, overrides: str) -> tuple[list[int], dict]:
    """--seeds and --overrides, or exit saying what they must be."""
    try:
        return [int(s) for s in raw.split(",") if s.strip()], json.loads(overrides)
    except ValueError as exc:
        sys.exit(f"--overrides must be JSON and --seeds comma-separated integers: {exc}")


def log_in(client: httpx.Client, args: argparse.Namespace) -> None:
    try:
        login(client, args.user, args.password)
    except KeyError:
        sys.exit(f"{args.url} set no CSRF cookie on /accounts/login/: is a Rollway site there?")


def launch_comparison(
    client: httpx.Client, args: argparse.Namespace, name: str, seeds: list[int], overrides: dict
) -> tuple[dict, dict, list[str]]:
    """Launch one comparison of --presets (default: every built-in preset) × `seeds` in
    --team: (the comparison as the site answers, the team, the presets)."""
    team = pick_team(client, args.team)
    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    if not presets:
        presets = [x["name"] for x in check(client.get("/api/presets"), "GET /api/presets")["presets"]]
    body = {"team": team["id"], "name": name, "configurations": presets, "seeds": seeds}
    if overrides:
        body["overrides"] = overrides
    return check(post(client, "/api/comparisons", body), "POST /api/comparisons"), team, presets


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site_arguments(p, seeds="0,1")
    p.add_argument("--overrides", default="{}", help="JSON merged onto every configuration")
    p.add_argument("--name", default=None, help="the comparison's name (default: presets <time>)")
    p.add_argument("--target", type=float, default=None, help="reward target of the summary (site default 0.8)")
    p.add_argument("--budget", type=float, default=None, help="wall-time budget, s (site default 60)")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="give up waiting after this many seconds")
    args = p.parse_args()
    seeds, overrides = parse_seeds(args.seeds, args.overrides)

    t_start = time.monotonic()
    with httpx.Client(base_url=args.url, timeout=60) as client:
        try:
            log_in(client, args)
            name = args.name or f"presets {time.strftime('%Y-%m-%d %H:%M')}"
            comparison, team, presets = launch_comparison(client, args, name, seeds, overrides)
            print(
                f"comparison {comparison['id']} {name!r} in team {team['name']}: {len(presets)} presets × "
                f"seeds {seeds} = {len(comparison['runs'])} runs queued; overrides={json.dumps(overrides)}",
                flush=True,
            )
            runs = wait_for_runs(client, comparison["id"], poll_s=args.poll, timeout_s=args.timeout)
            params = {"runs": ",".join(str(r["id"]) for r in runs), "what": "summary"}
            params.update({k: v for k, v in (("target", args.target), ("budget", args.budget)) if v is not None})
            data = check(client.get("/api/compare", params=params), "GET /api/compare")
        except httpx.TransportError as exc:
            sys.exit(f"cannot reach the site at {args.url}: {exc!r} (is `manage.py up` running?)")
        except SiteError as exc:
            sys.exit(str(exc))

    print(f"\n## Runs (comparison {comparison['id']})\n")
    print("| run | configuration | seed | status | duration (s) |")
    print("|---|---|---|---|---|")
    for r in runs:
        d = duration_s(r)
        print(f"| {r['id']} | {r['preset']} | {r['seed']} | {r['status']} | {'—' if d is None else f'{d:.0f}'} |")
    failed = [r for r in runs if r["status"] != "succeeded"]
    for r in failed:
        print(f"\nrun {r['id']} ({r['preset']}, seed {r['seed']}) {r['status']}: {r['error'] or '(no error text)'}")
    durations = [d for d in map(duration_s, runs) if d is not None]
    print(
        f"\n{len(runs) - len(failed)}/{len(runs)} succeeded; run durations sum {sum(durations):.0f} s; "
        f"wall time {time.monotonic() - t_start:.0f} s"
    )

    print(f"\n## Summary (target {data['target']}, budget {data['budget_s']} s; mean ± half the seeds' range)\n")
    print(summary_markdown(data["summary"]))
    base = args.url.rstrip("/")
    print(f"\ncompare page: {base}{comparison['compare_url']}")
    print(f"comparison page: {base}{comparison['url']}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
