"""Stragglers in multi-agent episodes, and what scheduling by episode recovers.

Task propose_solve (a proposer poses a problem over given numbers, a solver answers it;
one policy in both roles), whose two environments answer each turn after a wait drawn
with a heavy tail on purpose: median `--median-s`, p90/median `--ratio` for each agent.
Three layouts of the same run, through the real driver and actors on in-process Ray
(bench/sync_vs_async.py's `run_mode`), for each preset in `--presets`:

- ``barrier``: buffer.unit group, an inference call's groups reach the buffer together
  once every one of its episodes has ended (what every surveyed library does);
- ``episode``: buffer.unit episode, each group the moment its episodes end, new ones
  started meanwhile;
- ``overcommit``: as episode, with buffer.overcommit `--overcommit` more groups
  admitted than the batch needs: the trainer takes the batch_groups that end first, the
  late ones train a step later (staleness ≤ buffer.max_staleness, counted).

Per run: each agent's and the whole episode's completion-time p50 and p90 over the run's
episodes together (the driver summary's `episodes`), the episode's p90 over one agent's
median (the compounding), step time, samples/s, trainer idle, staleness and late groups
per step (figures over steps 2..N). A step's wait over one agent's median is the
joint wait the trainer sees: the batch's slowest group under the barrier. samples/s
counts rollouts, one per agent turn (two per episode); trainer idle s is the trainer's
idle fraction × the step time.

    nice -n 5 .venv/bin/python bench/episode_stragglers.py
    nice -n 5 .venv/bin/python bench/episode_stragglers.py --presets sync --steps 10 --median-s 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import ray
from sync_vs_async import run_mode, steady

from workers.core.merge import deep_merge, parse_sets
from workers.core.run_actors import NAMESPACE, init_local_ray

LAYOUTS = ("barrier", "episode", "overcommit")


def layout_config(layout: str, overcommit: int) -> dict:
    if layout == "barrier":
        return {"buffer": {"unit": "group"}}
    return {"buffer": {"unit": "episode", "overcommit": overcommit if layout == "overcommit" else 0}}


def figures(out: dict) -> dict:
    r = steady(out)
    series = {k: dict(v) for k, v in out["series"].items()}
    steps = sorted(series["samples/per_s"])[1:]
    r["trainer_busy"] = 1.0 - r["trainer_idle"]
    late = series.get("buffer/late_groups", {})
    r["late_per_step"] = (late[steps[-1]] - late.get(steps[0] - 1, 0.0)) / len(steps) if late else 0.0
    r["staleness"] = statistics.mean(series["staleness/mean"][k] for k in steps)
    r["solver_reward"] = statistics.mean(series["agent/solver/reward_mean"][k] for k in steps)
    r["proposer_reward"] = statistics.mean(series["agent/proposer/reward_mean"][k] for k in steps)
    r["episodes"] = out["episodes"]
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="sync,async", help="comma-separated presets (sync, async)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    ap.add_argument("--steps", type=int, default=16, help="trainer steps per run (≥ 3)")
    ap.add_argument("--median-s", type=float, default=0.5, help="each agent's environment: median wait (s)")
    ap.add_argument("--ratio", type=float, default=5.0, help="each agent's environment: p90 / median")
    ap.add_argument("--overcommit", type=int, default=None, help="groups over the batch (default: batch_groups/2)")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.batch_groups=8 (repeatable)")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.steps < 3:
        raise SystemExit(f"--steps must be ≥ 3 (got {args.steps}): figures skip step 1 and need two more")
    layouts = args.layouts.split(",")
    if set(layouts) - set(LAYOUTS):
        raise SystemExit(f"--layouts: {sorted(set(layouts) - set(LAYOUTS))} are not of {', '.join(LAYOUTS)}")
    env = {"median_s": args.median_s, "p90_ratio": args.ratio}
    common = deep_merge(
        {
            "task": {
                "name": "propose_solve",
                "options": {f"{agent}_{k}": v for agent in ("proposer", "solver") for k, v in env.items()},
            },
            # Room for the late groups (a synchronous preset keeps one batch and drops
            # anything a version old); a synchronous run still admits nothing ahead.
            "buffer": {"capacity": 2, "max_staleness": 1},
            # Weights load between two turns: under drain no episode may start while
            # weights wait, so every version change would be a barrier again.
            "sync": {"update_mode": "in_flight"},
            "trainer": {"batch_groups": 8, "group_size": 4, "lr": 3e-3},
            "inference": {"max_new_tokens": 8},
            "warm_start": {"steps": 200, "noisy_steps": 0, "batch_size": 32, "lr": 3e-3},
            "stop": {"max_steps": args.steps, "max_minutes": 10},
        },
        parse_sets(args.set),
    )
    batch_groups = common["trainer"]["batch_groups"]
    overcommit = args.overcommit if args.overcommit is not None else max(1, batch_groups // 2)

    init_local_ray(NAMESPACE)
    results: dict[str, dict] = {}
    try:
        for p, preset in enumerate(args.presets.split(",")):
            for k, layout in enumerate(layouts):
                t = time.perf_counter()
                overrides = deep_merge(common, layout_config(layout, overcommit))
                out = run_mode(preset, overrides, args.cache_dir, run_id=991_000 + 10 * p + k)
                results[f"{preset} {layout}"] = figures(out)
                print(f"[{preset} {layout}] {time.perf_counter() - t:.0f}s", flush=True)
    finally:
        ray.shutdown()

    print(
        f"\nper agent: median {args.median_s} s, p90/median {args.ratio}; B={batch_groups} groups × "
        f"G={common['trainer']['group_size']} episodes; overcommit {overcommit}; steps={args.steps}; "
        f"overrides={json.dumps(parse_sets(args.set))}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    head = (
        f"{'run':20} {'proposer p50/p90 s':>18} {'solver p50/p90 s':>16} {'episode p50/p90 s':>17} "
        f"{'ep p90/agent p50':>16} {'step s':>7} {'step/agent p50':>14} {'samples/s':>9} {'trainer idle s':>14} "
        f"{'staleness':>9} "
        f"{'late/step':>9}"
    )
    print(head + "\n" + "-" * len(head))
    for name, r in results.items():
        e = r["episodes"]
        agent_p50 = statistics.mean([e["agent/proposer/p50_s"], e["agent/solver/p50_s"]])
        print(
            f"{name:20} {e['agent/proposer/p50_s']:>8.3f}/{e['agent/proposer/p90_s']:<9.3f} "
            f"{e['agent/solver/p50_s']:>7.3f}/{e['agent/solver/p90_s']:<8.3f} "
            f"{e['episode/p50_s']:>8.3f}/{e['episode/p90_s']:<8.3f} {e['episode/p90_s'] / agent_p50:>16.1f} "
            f"{r['step_s']:>7.2f} {r['step_s'] / agent_p50:>14.1f} {r['samples_per_s']:>9.1f} "
            f"{r['trainer_idle'] * r['step_s']:>14.2f} "
            f"{r['staleness']:>9.2f} "
            f"{r['late_per_step']:>9.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"overcommit": overcommit, "env": env, "results": results}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
