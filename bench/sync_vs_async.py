"""Sync vs async on the same engine code: throughput, idle fractions, reward.

Runs the same task, seed and config twice on in-process Ray, once with mode="sync"
(generate → train → sync, strictly alternating) and once with mode="async" (inference
runs ahead by max_staleness batches through the buffer), each through the real run
driver and actors (no site: the reporter keeps points in memory). Prints, per mode,
steady-state samples/s (steps 2..N: step 1 includes the first generation), trainer and
inference idle fractions, reward at the start and the end, and then the async/sync
throughput ratio next to the ideal (T_gen + T_train) / max(T_gen, T_train), with T_gen
and T_train measured in the sync run.

    .venv/bin/python bench/sync_vs_async.py                      # torch backend, 40 steps
    .venv/bin/python bench/sync_vs_async.py --steps 100 --set trainer.lr=3e-3
    .venv/bin/python bench/sync_vs_async.py --backend vllm --steps 20
    .venv/bin/python bench/sync_vs_async.py --repeat 3               # medians of 3 alternations
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import ray

from workers.config.presets import build, deep_merge
from workers.core.merge import parse_sets
from workers.core.run_actors import NAMESPACE, init_local_ray
from workers.rl_tasks import task_class
from workers.run.driver import RunDriver
from workers.run.paths import Confinement


def run_mode(mode: str, overrides: dict, cache_dir: str, run_id: int, confinement: Confinement | None = None) -> dict:
    """One run of preset `mode` with `overrides` through the real driver; `confinement`
    says where config paths may point (a model directory), as the site's settings do."""
    cfg = build(mode, overrides)
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE).remote(
        run_id, cfg.model_dump(mode="json"), None, "", cache_dir, exit_when_done=False, confinement=confinement
    )
    try:
        out = ray.get(driver.run.remote())
    finally:
        ray.kill(driver)
    if out["state"] != "succeeded":
        raise SystemExit(f"{mode} run {out['state']}: {out['error']}")
    out["config"] = cfg
    return out


def steady(out: dict) -> dict:
    """Figures over steps 2..N, each step weighted by its wall-time window."""
    s = {k: dict(v) for k, v in out["series"].items()}
    cfg = out["config"]
    # A multi-agent task's episode is a rollout per agent: samples/per_s counts rollouts.
    agents = len(getattr(task_class(cfg.task.name), "agents", ("",)))
    samples = cfg.trainer.batch_groups * cfg.trainer.group_size * agents
    steps = sorted(s["samples/per_s"])[1:]
    windows = {k: samples / s["samples/per_s"][k] for k in steps}
    total = sum(windows.values())

    def weighted(name: str) -> float:
        have = [k for k in steps if k in s.get(name, {})]
        span = sum(windows[k] for k in have)
        return sum(s[name][k] * windows[k] for k in have) / span if span else float("nan")

    rewards = [s["reward/mean"][k] for k in sorted(s["reward/mean"])]
    head = min(5, max(1, len(rewards) // 4))
    return {
        "steps": len(steps) + 1,
        "samples_per_s": len(steps) * samples / total,
        "step_s": total / len(steps),
        "trainer_idle": weighted("trainer/idle_frac"),
        "inference_idle": weighted("inference/idle_frac"),
        "t_gen": statistics.mean(
            (1 - s["inference/idle_frac"][k]) * windows[k] for k in steps if k in s["inference/idle_frac"]
        ),
        "t_train": statistics.mean(s["trainer/step_s"][k] for k in steps),
        "sync_ms": statistics.median(s["sync/latency_ms"].values()) if s.get("sync/latency_ms") else float("nan"),
        "sync_trainer_ms": statistics.median(s["sync/trainer_ms"].values()),
        "sync_inference_ms": statistics.median(s["sync/inference_ms"].values())
        if s.get("sync/inference_ms")
        else float("nan"),
        "sync_bytes": statistics.median(s["sync/bytes"].values()),
        "tokens_per_s": weighted("inference/tokens_per_s"),
        "staleness_mean": statistics.mean(s["staleness/mean"].values()),
        "dropped_stale": max(s["buffer/dropped_stale"].values()),
        "reward_start": statistics.mean(rewards[:head]),
        "reward_end": statistics.mean(rewards[-head:]),
        "reward_window": head,
        "timings": out["timings"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("torch", "vllm"), default="torch")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--minutes", type=float, default=5.0, help="time budget per mode")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.lr=3e-3")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the modes alternately this many times; figures are medians (the host is shared)",
    )
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    overrides = {"inference": {"backend": args.backend}, "stop": {"max_steps": args.steps, "max_minutes": args.minutes}}
    overrides = deep_merge(overrides, parse_sets(args.set))

    init_local_ray(NAMESPACE)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes.split(",")}
    try:
        for rep in range(args.repeat):
            for i, mode in enumerate(runs):
                t = time.perf_counter()
                out = run_mode(mode, overrides, args.cache_dir, run_id=990_000 + 10 * rep + i)
                r = steady(out)
                r["loadavg_1m"] = os.getloadavg()[0]
                runs[mode].append(r)
                print(
                    f"[{mode} #{rep + 1}] {r['steps']} steps in {time.perf_counter() - t:.0f}s: "
                    f"{r['samples_per_s']:.0f} samples/s (phases {_fmt(r['timings'])}; "
                    f"host load average {r['loadavg_1m']:.1f} on {os.cpu_count()} cores)",
                    flush=True,
                )
    finally:
        ray.shutdown()
    results = {
        m: {k: (statistics.median(r[k] for r in rs) if isinstance(rs[0][k], float | int) else rs[-1][k]) for k in rs[0]}
        for m, rs in runs.items()
    }

    print(f"\nbackend={args.backend}  config overrides={json.dumps(overrides)}")
    rows = [
        ("samples/s (steps 2..N)", "samples_per_s", "{:.1f}"),
        ("step wall time (s)", "step_s", "{:.3f}"),
        ("trainer idle fraction", "trainer_idle", "{:.2f}"),
        ("inference idle fraction", "inference_idle", "{:.2f}"),
        ("T_gen per step (s)", "t_gen", "{:.3f}"),
        ("T_train per step (s)", "t_train", "{:.3f}"),
        ("inference tokens/s", "tokens_per_s", "{:.0f}"),
        ("sync e2e incl. drain, median (ms)", "sync_ms", "{:.1f}"),
        ("sync trainer side, median (ms)", "sync_trainer_ms", "{:.1f}"),
        ("sync inference side, median (ms)", "sync_inference_ms", "{:.1f}"),
        ("sync bytes", "sync_bytes", "{:.0f}"),
        ("staleness mean", "staleness_mean", "{:.2f}"),
        ("groups dropped stale", "dropped_stale", "{:.0f}"),
        ("reward, first steps", "reward_start", "{:.3f}"),
        ("reward, last steps", "reward_end", "{:.3f}"),
    ]
    modes = list(results)
    print(f"{'':34}" + "".join(f"{m:>12}" for m in modes))
    for label, key, fmt in rows:
        print(f"{label:34}" + "".join(f"{fmt.format(results[m][key]):>12}" for m in modes))
    if {"sync", "async"} <= set(results):
        s, a = results["sync"], results["async"]
        ideal = (s["t_gen"] + s["t_train"]) / max(s["t_gen"], s["t_train"])
        ratios = [ra["samples_per_s"] / rs["samples_per_s"] for rs, ra in zip(runs["sync"], runs["async"], strict=True)]
        print(
            f"\nasync/sync throughput ratio: {a['samples_per_s'] / s['samples_per_s']:.2f}"
            + (f" (per repeat: {', '.join(f'{x:.2f}' for x in ratios)})" if len(ratios) > 1 else "")
        )
        print(
            f"ideal (T_gen+T_train)/max(T_gen,T_train) from the sync run: {ideal:.2f}"
            f"  (T_gen={s['t_gen']:.3f}s, T_train={s['t_train']:.3f}s; the rest of a sync step, "
            f"{s['step_s'] - s['t_gen'] - s['t_train']:.3f}s, is sync + scheduling)"
        )
        bound = max(a["t_gen"], a["t_train"])
        print(
            f"async pipeline: step {a['step_s']:.3f}s vs max(T_gen, T_train) in the async run "
            f"{bound:.3f}s → {bound / a['step_s']:.0%} of its own bound; bottleneck pool busy "
            f"{1 - min(a['trainer_idle'], a['inference_idle']):.0%} of wall time"
        )
        print(
            f"running side by side, async slowed each pool down: T_gen ×{a['t_gen'] / s['t_gen']:.2f}, "
            f"T_train ×{a['t_train'] / s['t_train']:.2f} (CPU contention: both pools share the host's cores)"
        )
        results["ratio"] = a["samples_per_s"] / s["samples_per_s"]
        results["ideal"] = ideal
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


def _fmt(timings: dict) -> str:
    return ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())


if __name__ == "__main__":
    raise SystemExit(main())
