"""Launch a run through a running Rollway site's API and report how its reward moved.

Measures the issue-2 bar end to end (site → Celery → Ray → metrics back in the
database): start reward, the first step and wall time at which the mean reward of the
last `--window` steps reaches `--target`, and the trainer/inference idle fractions.

    python manage.py up --port 8050 &          # or `make run`
    .venv/bin/python bench/reward_via_platform.py --url http://127.0.0.1:8050 \
        --preset async --overrides '{"inference": {"backend": "vllm"}}'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import httpx

TERMINAL = {"succeeded", "failed", "cancelled"}


def login(client: httpx.Client, user: str, password: str) -> None:
    client.get("/accounts/login/")
    r = client.post(
        "/accounts/login/",
        data={"username": user, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": str(client.base_url) + "/accounts/login/"},
    )
    if "sessionid" not in client.cookies:
        sys.exit(f"login as {user!r} failed (HTTP {r.status_code})")


def post(client: httpx.Client, path: str, body: dict) -> httpx.Response:
    return client.post(path, json=body, headers={"X-CSRFToken": client.cookies["csrftoken"]})


def series(client: httpx.Client, run_id: int, name: str) -> tuple[list[int], list[float]]:
    r = client.get(f"/api/runs/{run_id}/metrics", params={"series": name, "max_points": 100000})
    data = r.json()["series"].get(name) or {"steps": [], "values": []}
    return data["steps"], data["values"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--user", default="demo")
    p.add_argument("--password", default="demo")
    p.add_argument("--team", default="demo")
    p.add_argument("--preset", default="async")
    p.add_argument("--overrides", default="{}", help="JSON merged onto the preset")
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--window", type=int, default=5, help="steps averaged for the target")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()

    with httpx.Client(base_url=args.url, timeout=30) as client:
        login(client, args.user, args.password)
        name = f"{args.preset} {time.strftime('%H:%M:%S')}"
        r = post(
            client,
            "/api/runs",
            {"team": args.team, "name": name, "preset": args.preset, "overrides": json.loads(args.overrides)},
        )
        if r.status_code != 201:
            sys.exit(f"launch refused: HTTP {r.status_code} {r.text}")
        run = r.json()
        run_id = run["id"]
        t0 = time.monotonic()
        print(f"run {run_id} launched: preset={args.preset} overrides={args.overrides}")
        status = run["status"]
        while time.monotonic() - t0 < args.timeout:
            time.sleep(5)
            status = client.get(f"/api/runs/{run_id}").json()["status"]
            steps, rewards = series(client, run_id, "reward/mean")
            last = statistics.fmean(rewards[-args.window :]) if rewards else float("nan")
            print(
                f"  t={time.monotonic() - t0:6.0f}s status={status:10s} steps={len(steps):4d} "
                f"reward(last {args.window})={last:.3f}",
                flush=True,
            )
            if status in TERMINAL:
                break
        detail = client.get(f"/api/runs/{run_id}").json()
        steps, rewards = series(client, run_id, "reward/mean")
        _, times = (lambda d: (d["steps"], d["times"]))(
            client.get(f"/api/runs/{run_id}/metrics", params={"series": "reward/mean", "max_points": 100000})
            .json()["series"]
            .get("reward/mean", {"steps": [], "times": []})
        )
        if not rewards:
            print(f"no reward points; status={status} error={detail.get('error')!r}")
            return 1
        hit = next(
            (
                i
                for i in range(len(rewards))
                if i + 1 >= args.window and statistics.fmean(rewards[i + 1 - args.window : i + 1]) >= args.target
            ),
            None,
        )
        start = statistics.fmean(rewards[: args.window])
        print(f"\nrun {run_id}: status={status} steps={len(steps)}")
        print(f"start reward: first step {rewards[0]:.3f}, first {args.window} steps {start:.3f}")
        if hit is None:
            print(
                f"target {args.target} NOT reached; final reward (last {args.window}) = "
                f"{statistics.fmean(rewards[-args.window :]):.3f}"
            )
        else:
            print(
                f"target {args.target} reached at step {steps[hit]}, "
                f"{times[hit] - times[0]:.0f} s after the first trained step"
            )
        for name in ("samples/per_s", "trainer/idle_frac", "inference/idle_frac", "sync/latency_ms", "staleness/mean"):
            _, vals = series(client, run_id, name)
            if vals:
                print(f"{name:22s} mean={statistics.fmean(vals):9.3f} median={statistics.median(vals):9.3f}")
        print(f"started_at={detail.get('started_at')} finished_at={detail.get('finished_at')}")
        return 0 if hit is not None else 2


if __name__ == "__main__":
    sys.exit(main())
