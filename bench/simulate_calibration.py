"""The simulator against measured runs: each preset run on the real engine (in-process
Ray, the run driver and actors, no site), then simulated with the costs that run
measured (workers/simulate/measured.py), and the figures set side by side: samples/s,
the trainer's and the inference pool's idle shares, the mean staleness (steps 2..N,
weighted by each step's wall time).

    .venv/bin/python bench/simulate_calibration.py                          # sync, async, pipelinerl, trl-async
    .venv/bin/python bench/simulate_calibration.py --presets sync,skyrl --steps 30
    .venv/bin/python bench/simulate_calibration.py --markdown --json out.json
    .venv/bin/python bench/simulate_calibration.py --series tests/engine/data/calibration  # the test's recordings
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ray
from sync_vs_async import run_mode

from workers.config.presets import deep_merge
from workers.core.merge import parse_sets
from workers.core.run_actors import NAMESPACE, init_local_ray
from workers.simulate.measured import FIGURES, calibrate

# A preset's run, short and small: the figures are rates, so 24 steps of 16 × 8 samples do.
COMMON = {"stop": {"max_steps": 24, "max_minutes": 10}, "eval": {"every_steps": 0}}


def error(measured: float, predicted: float, name: str) -> float:
    """Relative error for samples/s and staleness; for an idle share (already a share of
    the wall time), the difference in points."""
    if name.endswith("idle_frac"):
        return predicted - measured
    return (predicted - measured) / measured if measured else float("nan")


def save_series(path: str, cfg, series: dict) -> None:
    """The run's config and the series the simulator reads, as calibrate takes them back."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"config": cfg.model_dump(mode="json"), "series": series}, f, separators=(",", ":"))
        f.write("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="sync,async,pipelinerl,trl-async")
    ap.add_argument("--steps", type=int, default=COMMON["stop"]["max_steps"])
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.batch_groups=8")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--series",
        metavar="DIR",
        help="also write each run's config and series to DIR/<preset><suffix>.json (what the calibration test replays)",
    )
    ap.add_argument(
        "--suffix",
        default="",
        help="appended to each recording's name: a variant of a preset (its --set), e.g. '+trainer-bound'",
    )
    args = ap.parse_args()

    overrides = deep_merge(deep_merge(COMMON, {"stop": {"max_steps": args.steps}}), parse_sets(args.set))
    init_local_ray(NAMESPACE)
    results: dict[str, dict] = {}
    try:
        for i, preset in enumerate(args.presets.split(",")):
            t = time.perf_counter()
            out = run_mode(preset, overrides, args.cache_dir, run_id=991_000 + i)
            series = {k: list(v) for k, v in out["series"].items()}
            results[preset] = calibrate(series, out["config"])
            if args.series:
                save_series(os.path.join(args.series, f"{preset}{args.suffix}.json"), out["config"], series)
            print(f"[{preset}] ran and simulated in {time.perf_counter() - t:.0f}s", flush=True)
    finally:
        ray.shutdown()

    print(f"\nconfig overrides={json.dumps(overrides)}; host load average {os.getloadavg()[0]:.1f}")
    head = ["preset", "figure", "measured", "predicted", "error"]
    rows = []
    for preset, r in results.items():
        for name in FIGURES:
            m, p = r["measured"][name], r["predicted"][name]
            e = error(m, p, name)
            shown = f"{e:+.3f}" if name.endswith("idle_frac") else f"{e:+.1%}"
            rows.append([preset, name, f"{m:.3f}", f"{p:.3f}", shown])
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print("\ncosts fed to the simulator:\n")
        keys = list(next(iter(results.values()))["costs"])
        print("| preset | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1))
        for preset, r in results.items():
            print(f"| {preset} | " + " | ".join(f"{r['costs'][k]:.4g}" for k in keys) + " |")
    else:
        for row in [head, *rows]:
            print(f"{row[0]:>12} {row[1]:>22} {row[2]:>10} {row[3]:>10} {row[4]:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
