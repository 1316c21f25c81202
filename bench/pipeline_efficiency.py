"""Pipeline efficiency per buffer mode and weight-update mode, on the real engine.

Each mode is one run through the real run driver and actors on in-process Ray (no
site), with the same task, seed and settings; the runs reuse bench/sync_vs_async.py
(`run_mode`, `steady`: figures over steps 2..N, step 1 includes the first generation).

Modes (the default sweep runs them all; a mode whose config equals an earlier one's
is not run twice, e.g. ``drain`` is ``bounded``):

- ``sync``: the synchronous baseline, preset "sync" (generate → train → sync);
- buffer modes on preset "async": ``none`` (buffer.mode none: nothing ahead, i.e. sync
  through the async code), ``double``, ``bounded`` (capacity 2), ``unbounded``;
- weight-update modes on preset "async" (bounded, capacity 2): ``drain``,
  ``abort_retry``, ``abort_resume``, ``in_flight`` (sync.update_mode).

Per mode: samples/s, trainer and inference busy fractions, the bottleneck pool (the
busier one) and its busy fraction against the 95% target, the throughput ratio to the
sync run, and the partial-rollout totals (rollout/partial_aborted / _resumed /
_retried) where the run emits them. Beside the ratios: the ideal
(T_gen + T_train) / max(T_gen, T_train), T_gen and T_train measured in the sync run.

    .venv/bin/python bench/pipeline_efficiency.py                     # torch, default sweep
    .venv/bin/python bench/pipeline_efficiency.py --modes sync,bounded,in_flight --steps 30
    .venv/bin/python bench/pipeline_efficiency.py --backend vllm --set trainer.lr=3e-3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ray
from sync_vs_async import run_mode, steady

from workers.config.presets import build, deep_merge
from workers.core.merge import parse_sets
from workers.core.run_actors import NAMESPACE, init_local_ray

# name → (preset, overrides on top of the common ones)
MODES: dict[str, tuple[str, dict]] = {
    "sync": ("sync", {}),
    "none": ("async", {"buffer": {"mode": "none"}}),
    "double": ("async", {"buffer": {"mode": "double"}}),
    "bounded": ("async", {"buffer": {"mode": "bounded", "capacity": 2}}),
    "unbounded": ("async", {"buffer": {"mode": "unbounded"}}),
    "drain": ("async", {"buffer": {"mode": "bounded", "capacity": 2}, "sync": {"update_mode": "drain"}}),
    "abort_retry": ("async", {"buffer": {"mode": "bounded", "capacity": 2}, "sync": {"update_mode": "abort_retry"}}),
    "abort_resume": ("async", {"buffer": {"mode": "bounded", "capacity": 2}, "sync": {"update_mode": "abort_resume"}}),
    "in_flight": ("async", {"buffer": {"mode": "bounded", "capacity": 2}, "sync": {"update_mode": "in_flight"}}),
}
PARTIAL_SERIES = ("rollout/partial_aborted", "rollout/partial_resumed", "rollout/partial_retried")
TARGET_BUSY = 0.95
# Short enough that the default sweep (8 distinct runs) fits in ~6 minutes on 2 quiet cores.
DEFAULT_STEPS = 30


def efficiency(out: dict) -> dict:
    """`steady` figures plus busy fractions, the bottleneck pool and partial-rollout totals."""
    r = steady(out)
    r["trainer_busy"] = 1.0 - r["trainer_idle"]
    r["inference_busy"] = 1.0 - r["inference_idle"]
    r["bottleneck"] = "trainer" if r["trainer_busy"] >= r["inference_busy"] else "inference"
    r["bottleneck_busy"] = max(r["trainer_busy"], r["inference_busy"])
    series = out["series"]
    for name in PARTIAL_SERIES:  # cumulative counters: the total is the largest value
        if series.get(name):
            r[name.split("/")[1]] = max(v for _, v in series[name])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("torch", "vllm"), default="torch")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="trainer steps per mode (≥ 3)")
    ap.add_argument("--minutes", type=float, default=3.0, help="time budget per mode")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {list(MODES)}")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.lr=3e-3 (repeatable)")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise SystemExit(f"--modes: unknown {bad or 'none given'}; choose from {list(MODES)}")
    if args.steps < 3:
        raise SystemExit(f"--steps must be ≥ 3 (got {args.steps}): figures skip step 1 and need two more")
    common = {"inference": {"backend": args.backend}, "stop": {"max_steps": args.steps, "max_minutes": args.minutes}}
    common = deep_merge(common, parse_sets(args.set))
    configs = {}
    for m in modes:  # validate everything before the first run starts
        preset, extra = MODES[m]
        overrides = deep_merge(common, extra)
        configs[m] = (preset, overrides, build(preset, overrides).model_dump_json())

    init_local_ray(NAMESPACE)
    results: dict[str, dict] = {}
    by_config: dict[str, str] = {}
    try:
        for i, m in enumerate(modes):
            preset, overrides, key = configs[m]
            if key in by_config:  # same config as an earlier mode: same run
                results[m] = dict(results[by_config[key]], same_run_as=by_config[key])
                print(f"[{m}] same config as {by_config[key]}: not run again", flush=True)
                continue
            t = time.perf_counter()
            r = efficiency(run_mode(preset, overrides, args.cache_dir, run_id=980_000 + i))
            r["loadavg_1m"] = os.getloadavg()[0]
            results[m] = r
            by_config[key] = m
            print(
                f"[{m}] {r['steps']} steps in {time.perf_counter() - t:.0f}s: {r['samples_per_s']:.1f} samples/s "
                f"(host load average {r['loadavg_1m']:.1f} on {os.cpu_count()} cores)",
                flush=True,
            )
    finally:
        ray.shutdown()

    sync = results.get("sync")
    ideal = None
    if sync:
        ideal = (sync["t_gen"] + sync["t_train"]) / max(sync["t_gen"], sync["t_train"])
        for r in results.values():
            r["ratio_to_sync"] = r["samples_per_s"] / sync["samples_per_s"]

    print(f"\nbackend={args.backend}  steps={args.steps}  overrides={json.dumps(parse_sets(args.set))}")
    head = (
        f"{'mode':13} {'samples/s':>9} {'trainer':>8} {'infer':>6} {'bottleneck':>11} {'busy':>6} "
        f"{'≥95%':>4} {'vs sync':>7}  {'aborted':>7} {'resumed':>7} {'retried':>7}"
    )
    print(head + "\n" + "-" * len(head))
    for m, r in results.items():
        partial = [
            f"{r[k]:>7.0f}" if k in r else f"{'-':>7}"
            for k in ("partial_aborted", "partial_resumed", "partial_retried")
        ]
        ratio = f"{r['ratio_to_sync']:>7.2f}" if "ratio_to_sync" in r else f"{'-':>7}"
        meets = "yes" if r["bottleneck_busy"] >= TARGET_BUSY else "no"
        print(
            f"{m:13} {r['samples_per_s']:>9.1f} {r['trainer_busy']:>8.0%} {r['inference_busy']:>6.0%} "
            f"{r['bottleneck']:>11} {r['bottleneck_busy']:>6.1%} {meets:>4} "
            f"{ratio}  {' '.join(partial)}" + (f"  (= {r['same_run_as']})" if "same_run_as" in r else "")
        )
    if sync:
        print(
            f"\nideal async/sync ratio (T_gen+T_train)/max(T_gen,T_train) from the sync run: {ideal:.2f} "
            f"(T_gen={sync['t_gen']:.3f}s, T_train={sync['t_train']:.3f}s, sync step {sync['step_s']:.3f}s)"
        )
        best = max((m for m in results if m != "sync"), key=lambda m: results[m]["samples_per_s"], default=None)
        if best:
            print(
                f"best measured: {best} at {results[best]['ratio_to_sync']:.2f}× sync "
                f"({results[best]['ratio_to_sync'] / ideal:.0%} of the ideal)"
            )
    else:
        print("\n(no sync run in --modes: no ratios, no ideal)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "backend": args.backend,
                    "steps": args.steps,
                    "ideal": ideal,
                    "target_busy": TARGET_BUSY,
                    "modes": results,
                },
                f,
                indent=2,
                default=str,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
