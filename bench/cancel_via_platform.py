"""Against a running Rollway site: bad configs are refused per field (HTTP 400), and a
training run cancelled through the API shows `cancelled` (the Celery task marks it only
after no `run-<id>*` Ray actor is left) — prints how long that took.

    python manage.py up --port 8050 &
    .venv/bin/python bench/cancel_via_platform.py --url http://127.0.0.1:8050
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
from reward_via_platform import login, post


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--team", default="demo")
    args = p.parse_args()
    c = httpx.Client(base_url=args.url, timeout=30)
    login(c, "demo", "demo")
    for bad in [{"buffer": {"capacity": -1}}, {"buffer": {"capacty": 2}}, {"trainer": {"lr": "fast"}}]:
        r = post(c, "/api/runs", {"team": args.team, "name": "bad", "preset": "async", "overrides": bad})
        print(f"{json.dumps(bad):36s} → HTTP {r.status_code} {r.text[:160]}")
    r = post(
        c,
        "/api/runs",
        {"team": args.team, "name": "to-cancel", "preset": "async", "overrides": {"stop": {"max_steps": 100000}}},
    )
    run_id = r.json()["id"]
    while not (
        c.get(f"/api/runs/{run_id}/metrics", params={"series": "policy/version"})
        .json()["series"]
        .get("policy/version", {})
        .get("steps")
    ):
        time.sleep(1)
    t0 = time.monotonic()
    print(f"run {run_id} is training; cancel → HTTP {post(c, f'/api/runs/{run_id}/cancel', {}).status_code}")
    while c.get(f"/api/runs/{run_id}").json()["status"] != "cancelled":
        time.sleep(0.2)
    print(f"status cancelled {time.monotonic() - t0:.1f} s after the request")


if __name__ == "__main__":
    main()
