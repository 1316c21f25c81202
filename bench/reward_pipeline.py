"""Scoring after generation vs pipelined with it, on the real engine.

Three runs of preset `--preset` (async by default; sync is where the trainer waits for
generation and scoring every step) through the real driver and actors on in-process Ray (no site), same task,
seed and settings (bench/sync_vs_async.py's `run_mode`; figures over steps 2..N):

- ``inline``: rewards.workers 0, the inference worker scores with the task's verifier
  (free here); it measures generation's token rate;
- ``after``: a pool of `--workers` reward workers scores each group once its generate
  call is done;
- ``pipelined``: the same pool scores each completion every `--chunk-tokens` tokens
  while it is generated.

Scoring is made to cost about as much as generating: the verifier is given
rewards.verifier_cost_ms_per_token = workers × 1000 / (the inline run's tokens per
second of generating: its tokens/s over its inference busy fraction), so the pool needs
as long to score a batch's tokens as the inference workers took to generate them
(`--cost-ms` sets it instead).

Per mode: step time, samples/s, busy fraction of each pool (inference: generating;
reward: scoring; trainer: not waiting for data) and the lag from a token's generation
to its score (reward/scoring_lag_ms: from a chunk's last token in pipelined, from the
end of the generate call in after, which flatters after: its first tokens waited longer).

    nice -n 5 .venv/bin/python bench/reward_pipeline.py
    nice -n 5 .venv/bin/python bench/reward_pipeline.py --preset sync
    nice -n 5 .venv/bin/python bench/reward_pipeline.py --steps 12 --workers 2 --chunk-tokens 4 --json out.json
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

from workers.config.presets import deep_merge
from workers.core.merge import parse_sets
from workers.core.run_actors import NAMESPACE, init_local_ray

DEFAULT_STEPS = 10


def figures(out: dict) -> dict:
    r = steady(out)
    series = {k: dict(v) for k, v in out["series"].items()}
    steps = sorted(series["samples/per_s"])[1:]
    r["trainer_busy"] = 1.0 - r["trainer_idle"]
    r["inference_busy"] = 1.0 - r["inference_idle"]
    r["tokens_per_s"] = statistics.mean(series["inference/tokens_per_s"][k] for k in steps)

    def mean(name: str) -> float:
        have = [v for k, v in series.get(name, {}).items() if k in steps]
        return statistics.mean(have) if have else float("nan")

    r["reward_busy"] = mean("reward/pool_busy_frac")
    r["lag_ms"] = mean("reward/scoring_lag_ms")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="trainer steps per mode (≥ 3)")
    ap.add_argument("--minutes", type=float, default=4.0, help="time budget per mode")
    ap.add_argument("--preset", choices=("async", "sync"), default="async", help="the runs' preset")
    ap.add_argument("--workers", type=int, default=1, help="rewards.workers of the after and pipelined runs")
    ap.add_argument("--chunk-tokens", type=int, default=4, help="rewards.chunk_tokens of the pipelined run")
    ap.add_argument("--cost-ms", type=float, default=None, help="verifier cost per token (default: matched)")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.lr=3e-3 (repeatable)")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.steps < 3:
        raise SystemExit(f"--steps must be ≥ 3 (got {args.steps}): figures skip step 1 and need two more")
    if args.workers < 1:
        raise SystemExit(f"--workers must be ≥ 1 (got {args.workers})")
    common = deep_merge({"stop": {"max_steps": args.steps, "max_minutes": args.minutes}}, parse_sets(args.set))

    init_local_ray(NAMESPACE)
    results: dict[str, dict] = {}
    try:
        t = time.perf_counter()
        results["inline"] = figures(run_mode(args.preset, common, args.cache_dir, run_id=990_000))
        inline = results["inline"]
        generating = inline["tokens_per_s"] / inline["inference_busy"]  # tokens per second spent generating
        print(f"[inline] {time.perf_counter() - t:.0f}s, {generating:.0f} tok/s while generating", flush=True)
        cost = args.cost_ms if args.cost_ms is not None else args.workers * 1000 / generating
        for i, mode in enumerate(("after", "pipelined"), start=1):
            rewards = {
                "workers": args.workers,
                "mode": mode,
                # A chunk size is read by the pipelined stage only (a launch refuses it elsewhere).
                "chunk_tokens": args.chunk_tokens if mode == "pipelined" else 0,
                "verifier_cost_ms_per_token": round(cost, 3),
            }
            t = time.perf_counter()
            results[mode] = figures(
                run_mode("async", deep_merge(common, {"rewards": rewards}), args.cache_dir, 990_000 + i)
            )
            print(f"[{mode}] {time.perf_counter() - t:.0f}s", flush=True)
    finally:
        ray.shutdown()

    print(
        f"\npreset={args.preset}  steps={args.steps}  reward workers={args.workers}  chunk_tokens={args.chunk_tokens}  "
        f"verifier cost={cost:.3f} ms/token  overrides={json.dumps(parse_sets(args.set))}  "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    head = (
        f"{'mode':10} {'step s':>7} {'samples/s':>9} {'inference busy':>14} {'reward busy':>11} "
        f"{'trainer busy':>12} {'lag ms':>7}"
    )
    print(head + "\n" + "-" * len(head))
    for m, r in results.items():
        reward = f"{r['reward_busy']:>11.2f}" if m != "inline" else f"{'-':>11}"
        lag = f"{r['lag_ms']:>7.0f}" if m != "inline" else f"{'-':>7}"
        print(
            f"{m:10} {r['step_s']:>7.2f} {r['samples_per_s']:>9.1f} {r['inference_busy']:>14.2f} {reward} "
            f"{r['trainer_busy']:>12.2f} {lag}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cost_ms_per_token": cost, "results": results}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
