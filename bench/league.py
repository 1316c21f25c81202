"""The league table: every built-in preset run on one workload and seeds here, through a
running Rollway site, then simulated at 7B and 32B on 64 and 512 GPUs; printed as the
markdown docs/league.md holds, with the date and the command.

Launches one comparison (`POST /api/comparisons`) of every preset (or `--presets`) ×
`--seeds` with `--overrides` shared by every run, waits until each run has ended, asks the
site to simulate each preset at the league's scales (`POST
/api/comparisons/<id>/league/simulate`), and prints the league (`GET
/api/comparisons/<id>/league`): one row per preset, the measured figures (mean over the
seeds) and the simulated ones, then what each preset only approximates of its library.
`--comparison ID` prints the league of a comparison already on the site instead.

    ROLLWAY_MAX_RUNNING=1 python manage.py up --port 8050 &
    .venv/bin/python bench/league.py --url http://127.0.0.1:8050
    .venv/bin/python bench/league.py --url http://127.0.0.1:8050 --comparison 12
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx
from compare_presets import SiteError, add_site_arguments, check, launch_comparison, log_in, parse_seeds, wait_for_runs
from reward_via_platform import post

# One workload for every preset: the default task, its held-out split evaluated every 10
# steps on 64 prompts (the pass@1 gain column), 150 steps, one torch thread per actor so
# that no preset gets more of the host than another. A warm start of 60 clean and 60
# noisy steps leaves the rewards room to rise (from about 0.16), where the default's 200 +
# 200 start a run close to the target. 150 steps: the reward levels off near 0.8 after
# 50–100 steps, so the target separates the presets by when they get there, and the
# held-out score has time to move beyond one prompt's worth.
WORKLOAD = {
    "inference": {"backend": "torch"},
    "warm_start": {"steps": 60, "noisy_steps": 60},
    "eval": {"every_steps": 10, "num_prompts": 64},
    "stop": {"max_steps": 150, "max_minutes": 10},
    "placement": {"cpu_threads": 1},
}


def league_markdown(league: dict) -> str:
    """The league as a markdown table (★: the best of a column), then each preset's
    approximations."""
    columns = league["columns"]
    header = ["preset"] + [f"{c['label']} ({c['group'].removeprefix('simulated: ')})" for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in league["rows"]:
        cells = [row["configuration"]]
        for col in columns:
            cell = row["cells"][col["key"]]  # as the league page shows it
            best = row["configuration"] in league["best"][col["key"]]
            cells.append(cell["text"] + (" ★" if best and cell["value"] is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- **{r['configuration']}**: {r['approximates']}" for r in league["rows"] if r["approximates"]]
    if notes:
        lines += ["", "Where a preset approximates its library:", "", *notes]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site_arguments(p, seeds="0,1,2")
    p.add_argument("--overrides", default=json.dumps(WORKLOAD), help="JSON merged onto every preset")
    p.add_argument("--target", type=float, default=0.8, help="the reward time to target aims at")
    p.add_argument("--comparison", type=int, default=None, help="print the league of this comparison instead")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="give up waiting after this many seconds")
    args = p.parse_args()
    seeds, overrides = parse_seeds(args.seeds, args.overrides)

    t0 = time.monotonic()
    with httpx.Client(base_url=args.url, timeout=300) as client:
        try:
            log_in(client, args)
            comparison_id = args.comparison
            if comparison_id is None:
                name = f"league {time.strftime('%Y-%m-%d %H:%M')}"
                comparison, _, presets = launch_comparison(client, args, name, seeds, overrides)
                comparison_id = comparison["id"]
                print(f"comparison {comparison_id}: {len(presets)} presets × seeds {seeds}", flush=True)
                runs = wait_for_runs(client, comparison_id, poll_s=args.poll, timeout_s=args.timeout)
                for r in runs:
                    if r["status"] != "succeeded":
                        print(f"run {r['id']} ({r['preset']}, seed {r['seed']}) {r['status']}: {r['error']}")
                simulated = check(
                    post(client, f"/api/comparisons/{comparison_id}/league/simulate", {}), "POST league/simulate"
                )
                for cell, why in simulated["errors"].items():
                    print(f"not simulated: {cell}: {why}", flush=True)
            league = check(
                client.get(f"/api/comparisons/{comparison_id}/league", params={"target": args.target}),
                "GET league",
            )
        except httpx.TransportError as exc:
            sys.exit(f"cannot reach the site at {args.url}: {exc!r} (is `manage.py up` running?)")
        except SiteError as exc:
            sys.exit(str(exc))

    wl = league["workload"]
    print(f"\n## League of comparison {comparison_id}, {time.strftime('%Y-%m-%d')}\n")
    print(f"Measured here: seeds {seeds}, overrides {json.dumps(overrides)}, target reward {args.target}.")
    print(
        f"Simulated: {wl['steps']} steps of completions of median {wl['median_tokens']} and p90 "
        f"{wl['p90_tokens']} tokens (cut at {wl['max_tokens']}), {wl['group_size']} per prompt.\n"
    )
    print(league_markdown(league))
    print(f"\nleague page: {args.url.rstrip('/')}/comparisons/{comparison_id}/league/")
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
