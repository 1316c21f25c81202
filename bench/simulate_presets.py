"""Every built-in preset on a simulated cluster (workers/simulate): model size ×
completion length × GPU count × inference:trainer split, one row each, then the
calibration table (the published single-H100 generation times against the simulator's)
and the simulator's own speed; or the published figures of verl and AReaL beside the
simulator's (workers/simulate/published.py).

    nice -n 5 .venv/bin/python bench/simulate_presets.py                 # the whole grid
    .venv/bin/python bench/simulate_presets.py --presets sync,async --models 7B --lengths 8192 --gpus 64
    .venv/bin/python bench/simulate_presets.py --speed                   # 32B × 1,024 GPUs × 1,000 steps
    .venv/bin/python bench/simulate_presets.py --published               # the peers' published figures
    .venv/bin/python bench/simulate_presets.py --published --fit         # fit the constants again first

Workload per row: completions lognormal with median = length/4 and p90 = 0.6·length,
cut at length; 512-token prompts; 16 completions per prompt and max(32, min(512,
GPUs)) prompts per step (512 rollouts up to 32 GPUs, 8,192 from 512). Disaggregated
7B inference workers take one GPU, 32B four (tensor parallel). Every ratio is over the
`sync` preset as the engine lays it out (disaggregated) at its best split.
`sync@colocated` is the sync preset with every GPU generating and then training in
turns, vLLM asleep with its weights in host memory while the trainer works
(inference.sleep_level 1): the engine shares a GPU between one worker and one rank, so
its workers take one GPU each, and a model whose weights and KV cache do not fit on one
GPU cannot be laid out so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from workers.config.presets import PRESETS, build
from workers.simulate import MODELS, Cluster, Workload, published, simulate
from workers.simulate.calibration import SEED_GENERATION, SEED_SOURCE, generation_seconds, kv_read_floor_seconds

COLOCATED_SYNC = "sync@colocated"
BASELINE = "sync"
TP = {"7B": 1, "32B": 4}
GROUP_SIZE = 16
TARGET_SAMPLES = 65_536  # "time to" this many trained samples: 128 steps at 8 GPUs, 8 at 1,024
MIN_STEPS = 20


def batch_groups(gpus: int) -> int:
    # A prompt's group goes to one worker whole: fewer groups than workers idles the rest.
    return max(32, min(512, gpus))


def workload(model: str, length: int) -> Workload:
    return Workload(MODELS[model], median_tokens=length // 4, p90_tokens=int(0.6 * length), max_tokens=length)


def preset_config(preset: str, gpus: int, overrides: dict | None = None):
    name = "sync" if preset == COLOCATED_SYNC else preset
    extra: dict = {"trainer": {"batch_groups": batch_groups(gpus), "group_size": GROUP_SIZE}}
    if preset == COLOCATED_SYNC:
        extra["placement"] = {"devices": "gpu", "mode": "colocated"}
        extra["inference"] = {"backend": "vllm", "sleep_level": 1}
    return build(name, {**extra, **(overrides or {})})


def tp(preset: str, model: str) -> int:
    return 1 if preset == COLOCATED_SYNC else TP[model]


def run_row(preset: str, model: str, length: int, gpus: int, split: float, seed: int = 0) -> dict:
    """One simulated run; its figures, or the reason it cannot be laid out."""
    row: dict = {"preset": preset, "model": model, "length": length, "gpus": gpus, "split": split}
    cfg = preset_config(preset, gpus)
    steps = max(MIN_STEPS, math.ceil(TARGET_SAMPLES / (batch_groups(gpus) * GROUP_SIZE)))
    try:
        cluster = Cluster(gpus, inference_share=split, tp=tp(preset, model))
        result = simulate(cfg, cluster, workload(model, length), steps, seed)
    except ValueError as exc:
        return {**row, "error": str(exc)}
    s = result.summary
    return {
        **row,
        "workers": int(s["inference_workers"]),
        "ranks": int(s["trainer_ranks"]),
        "samples_per_s": s["samples_per_s"],
        "trainer_busy": s["trainer_busy"],
        "inference_busy": s["inference_busy"],
        "staleness_mean": s["staleness_mean"],
        "staleness_max": s["staleness_max"],
        "dropped_share": s["dropped_share"],
        "wasted_token_share": s["wasted_token_share"],
        "hours_to_target": (result.time_to_samples(TARGET_SAMPLES) or math.nan) / 3600,
        "sim_wall_s": s["wall_s"],
    }


HEADER = (
    f"{'preset':18s} {'model':>5s} {'len':>6s} {'GPUs':>5s} {'split':>5s} {'inf×tp':>7s} {'ranks':>5s} "
    f"{'samples/s':>9s} {'trainer':>7s} {'infer':>6s} {'stale':>5s} {'max':>3s} {'drop':>5s} {'waste':>5s} "
    f"{'h→64K':>6s}"
)


def format_row(r: dict) -> str:
    head = f"{r['preset']:18s} {r['model']:>5s} {r['length']:>6d} {r['gpus']:>5d} {r['split']:>5.2f}"
    if "error" in r:
        return f"{head}  — cannot lay out: {r['error'][:80]}"
    return (
        f"{head} {r['workers']:>4d}×{tp(r['preset'], r['model']):<2d} {r['ranks']:>5d} {r['samples_per_s']:>9.2f} "
        f"{r['trainer_busy']:>7.2f} {r['inference_busy']:>6.2f} {r['staleness_mean']:>5.2f} {r['staleness_max']:>3.0f} "
        f"{r['dropped_share']:>5.2f} {r['wasted_token_share']:>5.2f} {r['hours_to_target']:>6.2f}"
    )


def full_fine_tuning(preset: str) -> bool:
    return preset == COLOCATED_SYNC or not PRESETS[preset]["config"].lora.enabled


def winners(rows: list[dict]) -> list[dict]:
    """Per (model, length, GPUs): the fastest full fine-tuning row to the target (a LoRA
    preset trains fewer FLOPs per token: not the same work), and its speed-up over the
    sync preset's best split at the same size."""
    rows = [r for r in rows if full_fine_tuning(r["preset"])]
    out = []
    keys = sorted({(r["model"], r["length"], r["gpus"]) for r in rows}, key=lambda k: (k[0] != "7B", k[1], k[2]))
    for key in keys:
        same = [r for r in rows if (r["model"], r["length"], r["gpus"]) == key and "error" not in r]
        if not same:
            continue
        best = min(same, key=lambda r: r["hours_to_target"])
        base = [r for r in same if r["preset"] == BASELINE]
        ratio = min(r["hours_to_target"] for r in base) / best["hours_to_target"] if base else math.nan
        out.append({**best, "speedup_vs_sync": ratio})
    return out


def markdown(rows: list[dict], detail: tuple[str, int, int]) -> str:
    """Two tables for docs/simulation.md: every preset's samples/s over the sync preset's
    at their best splits, per size; and every figure of each preset at one size (`detail`)."""
    ok = [r for r in rows if "error" not in r]
    keys = sorted({(r["model"], r["length"], r["gpus"]) for r in ok}, key=lambda k: (k[0] != "7B", k[1], k[2]))
    presets = list(dict.fromkeys(r["preset"] for r in rows))

    def best(preset: str, key: tuple) -> dict | None:
        same = [r for r in ok if r["preset"] == preset and (r["model"], r["length"], r["gpus"]) == key]
        return max(same, key=lambda r: r["samples_per_s"]) if same else None

    head = "| preset | " + " | ".join(f"{m} {n // 1024}K {g}" for m, n, g in keys) + " |"
    lines = [head, "|---" * (len(keys) + 1) + "|"]
    for preset in presets:
        cells = []
        for key in keys:
            mine, base = best(preset, key), best(BASELINE, key)
            if mine is None or base is None:
                cells.append("—")
            elif preset == BASELINE:
                cells.append(f"{mine['samples_per_s']:.3g}/s ({mine['split']:g})")
            elif preset == COLOCATED_SYNC:
                cells.append(f"{mine['samples_per_s'] / base['samples_per_s']:.2f}")
            else:
                cells.append(f"{mine['samples_per_s'] / base['samples_per_s']:.2f} ({mine['split']:g})")
        lines.append(f"| {preset} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"| preset ({detail[0]}, {detail[1] // 1024}K, {detail[2]} GPUs, best split) | split | samples/s | "
        "trainer busy | inference busy | staleness mean / max | dropped | wasted tokens | h to 65,536 samples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in presets:
        r = best(preset, detail)
        if r is None:
            continue
        split = "all" if preset == COLOCATED_SYNC else f"{r['split']:g}"
        lines.append(
            f"| {preset} | {split} | {r['samples_per_s']:.2f} | {r['trainer_busy']:.2f} | "
            f"{r['inference_busy']:.2f} | {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} | "
            f"{r['dropped_share']:.3f} | {r['wasted_token_share']:.3f} | {r['hours_to_target']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def calibration_rows() -> list[dict]:
    rows = []
    for (model, tokens), seconds in SEED_GENERATION.items():
        predicted = generation_seconds(model, tokens)
        rows.append(
            {
                "model": model.name,
                "tokens": tokens,
                "published_min": seconds / 60,
                "predicted_min": None if predicted is None else predicted / 60,
                "kv_floor_min": kv_read_floor_seconds(model, tokens) / 60,
            }
        )
    return rows


def speed(seed: int = 0) -> dict:
    """The simulator's own speed at the largest size: 32B × 1,024 GPUs × 1,000 steps."""
    cfg = preset_config("async", 1024)
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(cfg, Cluster(1024, tp=4), workload("32B", 32768), 1000, seed)
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "events": result.summary["events"],
        "load_average": os.getloadavg()[0],
        "simulated_hours": result.summary["seconds"] / 3600,
    }


def print_published(refit: bool, json_path: str | None) -> int:
    """The peers' published figures beside the simulator's, as docs/simulation.md's table."""
    fit = published.FIT
    if refit:
        fit = published.fit_verl()
        print(f"fitted: {fit}")
    table = published.rows(fit)
    print(published.markdown(table), end="")
    held_out = [r for r in table if not r.fitted and r.ratio is not None]
    within = [r for r in held_out if abs(r.ratio - 1) <= 0.2]  # type: ignore[operator]
    print(f"\n{len(within)} of {len(held_out)} predicted figures within 20% of the published ones")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"fit": fit.__dict__, "rows": [{**r.__dict__, "ratio": r.ratio} for r in table]}, f, indent=1)
    return 0


def _list(parser: argparse.ArgumentParser, flag: str, text: str, kind, allowed=None) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v]
    except ValueError:
        parser.error(f"{flag}: {text!r} is not a comma-separated list of {kind.__name__}")
    bad = [v for v in values if allowed is not None and v not in allowed]
    if bad or not values:
        parser.error(f"{flag}: unknown {bad or text!r}; choose from {sorted(allowed) if allowed else 'numbers'}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [BASELINE, COLOCATED_SYNC, *(p for p in PRESETS if p != BASELINE)]
    parser.add_argument("--presets", default=",".join(names), help="comma-separated preset names")
    parser.add_argument("--models", default="7B,32B", help="comma-separated: 7B, 32B")
    parser.add_argument("--lengths", default="2048,8192,32768", help="completion caps in tokens")
    parser.add_argument("--gpus", default="8,64,1024", help="GPU counts")
    parser.add_argument("--splits", default="0.5", help="inference shares of the GPUs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--markdown", help="write the tables of docs/simulation.md to this file")
    parser.add_argument("--no-calibration", action="store_true", help="skip the calibration tables")
    parser.add_argument("--speed", action="store_true", help="only time 32B × 1,024 GPUs × 1,000 steps")
    parser.add_argument("--published", action="store_true", help="only the peers' published figures, simulated")
    parser.add_argument("--fit", action="store_true", help="with --published: fit the constants again first")
    args = parser.parse_args(argv)
    if args.published:
        return print_published(args.fit, args.json)
    if args.speed:
        figures = speed(args.seed)
        print(
            f"32B × 1,024 GPUs × 1,000 steps (async, 32K): {figures['wall_s']:.2f} s wall, "
            f"{figures['cpu_s']:.2f} s CPU, "
            f"{figures['events']:.0f} events, {figures['simulated_hours']:.0f} simulated hours; "
            f"load average {figures['load_average']:.1f} (target < 10 s)"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"speed": figures}, f, indent=1)
        return 0
    presets = _list(parser, "--presets", args.presets, str, set(names))
    models = _list(parser, "--models", args.models, str, set(MODELS))
    lengths = _list(parser, "--lengths", args.lengths, int)
    gpus = _list(parser, "--gpus", args.gpus, int)
    splits = _list(parser, "--splits", args.splits, float)
    if any(not 0 < s < 1 for s in splits):
        parser.error(f"--splits: each share must be between 0 and 1, exclusive (got {args.splits})")
    if any(n < 1 for n in gpus) or any(n < 4 for n in lengths):
        parser.error("--gpus must be ≥ 1 and --lengths ≥ 4 tokens")

    rows = []
    print(HEADER)
    for model in models:
        for length in lengths:
            for n in gpus:
                for split in splits:
                    for preset in presets:
                        row = run_row(preset, model, length, n, split, args.seed)
                        rows.append(row)
                        print(format_row(row), flush=True)
    print("\nfastest full fine-tuning to 65,536 samples per size (× = its speed-up over sync at its best split):")
    best = winners(rows)
    for r in best:
        print(
            f"  {r['model']:>3s} {r['length']:>6d} tok {r['gpus']:>5d} GPUs: {r['preset']:18s} split {r['split']:.2f} "
            f"{r['hours_to_target']:.2f} h  ×{r['speedup_vs_sync']:.2f}"
        )
    figures: dict = {"rows": rows, "winners": best}
    if args.markdown:
        detail = ("7B", 32768, 64)
        if detail not in {(r["model"], r["length"], r["gpus"]) for r in rows}:
            detail = (rows[0]["model"], rows[0]["length"], rows[0]["gpus"])
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, detail))
    if not args.no_calibration:
        print(f"\ngeneration of 512 rollouts on one H100 ({SEED_SOURCE}), minutes:")
        print(f"  {'model':>5s} {'tokens':>6s} {'published':>9s} {'predicted':>9s} {'KV floor':>8s}")
        figures["calibration"] = calibration_rows()
        for c in figures["calibration"]:
            pred = "no fit" if c["predicted_min"] is None else f"{c['predicted_min']:.1f}"
            print(
                f"  {c['model']:>5s} {c['tokens']:>6d} {c['published_min']:>9.1f} {pred:>9s} {c['kv_floor_min']:>8.1f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
