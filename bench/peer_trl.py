"""The peer benchmark: TRL's GRPOTrainer against Rollway sync and async, same workload.

One small real Hugging Face checkpoint (workers/model/tiny_hf.py: a byte-level BPE tokenizer
with a ChatML template and a tiny Qwen2) is made in a work directory and warm-started
once with Rollway's supervised warm start (workers/train/warmstart.py); TRL's GRPOTrainer,
Rollway `sync` and Rollway `async` then start RL from those same weights, on the same
prompts in the same order, with the same batch shape (B prompts × G completions per
step), max new tokens, temperature, learning rate, PPO clip, gradient clipping and
reward. Printed per side: samples/s and completion tokens/s (steps 2..N: step 1 holds
the first generation), wall time until the moving mean of the batch reward over the
last 5 steps (workers.core.metric_names.REWARD_WINDOW, what a run's stop.target_reward
judges on) first reaches `--target`, the reward of the first and last 5 steps, and the
busy fractions; then the async/TRL ratios against the target (≥ 2× TRL's samples/s and
less wall time to the target), and where each side's step time goes.

This compares speed. Whether each side *learns* (held-out pass@1 before and after, per
seed, on countdown and gsm8k) is bench/learning.py, which runs the same TRL runner.

The workload is generation-heavy: the `copy` task on strings of `--length` (64)
characters, a tokenizer without merges (one token per character), so a correct
completion is 64 tokens + EOS, and `--max-new-tokens` 72.

The defaults leave RL room to learn, so that time to target compares learning as well
as speed: 100 supervised warm-start steps bring the position reward to about 0.17, and
40 GRPO steps of B=8 × G=8 at lr 3e-4 raise it to about 0.21-0.22 on every side. After
200 warm-start steps the reward starts near 0.36 and moves by a few hundredths in 40
steps, a change one seed cannot tell from noise. The default target, 0.20, is where
each side's moving mean stands about halfway through its 40 steps (all three sides in
the first invocation at these settings). At lr 1e-3 and above TRL's reward falls.
Every `--seed` starts from the same weights: the tiny checkpoint and its warm start are
made with `--checkpoint-seed` (0), and `--seed` seeds the RL runs only (sampling, the
prompts' order), as bench/learning.py does. (A warm start made with seeds 1 and 2 left
the reward at 0.96-0.98: nothing left to learn, so no time to target to compare.)

TRL runs in a virtual environment of its own (`--venv`, default
$ROLLWAY_HOME/cache/peer-trl-venv, made on first use: torch==2.13.0 first, then the
TRL_PINS below with a constraints file pinning torch), as a subprocess
(bench/peer_trl_runner.py, a JSON spec in, JSON per-step figures out) with
HF_HUB_OFFLINE=1. Rollway runs through its real run driver and actors on in-process
Ray, as bench/sync_vs_async.py does (presets `sync` and `async`, torch backend; vLLM
with `--backends torch,vllm`).

What cannot be the same, and why:
- Sampling: each side draws its own random numbers (TRL through transformers'
  `generate` seeded by `set_seed(seed)`, Rollway per worker call from the run's seed),
  so the completions differ from the first step on; the prompts do not.
- The loss: TRL (beta 0, one iteration per generation, loss_type "bnpo": token mean over
  the batch) optimises PPO-clip on πθ/π_old with π_old = πθ detached, so the ratio is 1
  and the clip never binds. Rollway's π_old is its own forward, detached (one
  minibatch: no extra pass), and it weights each token by min(π_old/μ, 2) (token TIS, the `async` preset's default): in
  `sync` π_old/μ is 1 up to kernel differences, so the gradient is TRL's; in `async` the
  batch is up to one version stale and the weight corrects for it (TRL's sync trainer
  has no stale data to correct).
- Advantages: (r − mean) / (std + ε) per group on both, with ε = 1e-4 in TRL and 1e-6 in
  Rollway (neither can be set).
- Generation: TRL calls transformers' `generate` on the training model between steps;
  Rollway's torch backend runs its own decode loop on transformers' forward in a
  separate actor (and vLLM's engine with `--backends vllm`), with weights copied over
  after every step.
- Precision: TRL runs at GRPOConfig's default, bf16 mixed precision (`bf16` unset means
  on unless fp16 is; on the CPU, accelerate's bf16 autocast around the model's forward, in
  generation as in training; the runner reports what its Trainer ran with), as a user's
  would; Rollway at its own default, float32 (`trainer.dtype`, `inference.dtype`).
  `--trl-fp32` turns TRL's bf16 off, Rollway's precision: a sensitivity setting, labelled
  as such in the table and wherever it is quoted. On this tiny model on a CPU bf16 costs
  both sides time (docs/benchmarks.md); `--set trainer.dtype=bfloat16 --set
  inference.dtype=bfloat16` is the sensitivity row that gives Rollway TRL's precision.
- Threads: TRL's process uses torch's default (one per core), as a user's would;
  Rollway's actors use the thread counts the engine gives them. Both share the host's
  cores. `--trl-threads N` holds TRL to N threads: a sensitivity setting, not TRL's
  default, and a figure measured with it is labelled as such wherever it is quoted. (On
  a busy 2-core host TRL's two threads can wait on each other: its generate step once
  took 6.3 s with 2 threads against 1.0 s with 1. That is a reason to run the
  sensitivity row beside the default one, not to replace it.)
- Time to target counts from the start of training (TRL: `train()` begins; Rollway: its
  loops start), after model loading and actor start-up on both sides; the start-up
  times are printed apart.
- Completion tokens: TRL's are every token generated; Rollway's (inference/tokens_per_s)
  are every token its workers generated, which in async includes groups generated
  ahead of the trainer and groups dropped as stale (counted on the same line).

    .venv/bin/python bench/peer_trl.py                       # B=8 × G=8, 40 steps a side (~3 min)
    .venv/bin/python bench/peer_trl.py --quick               # smoke test: 4 steps, B=4 × G=4
    # docs/benchmarks.md's table: the defaults, TRL on its default threads and precision, one run per seed
    for s in 0 1 2; do .venv/bin/python bench/peer_trl.py --work-dir /tmp/peer --markdown --seed $s; done
    # sensitivity rows, labelled as such where quoted: TRL in float32; TRL held to one
    # thread; Rollway in bf16 as TRL's default; Rollway's actors given two threads each
    .venv/bin/python bench/peer_trl.py --work-dir /tmp/peer --markdown --trl-fp32
    .venv/bin/python bench/peer_trl.py --work-dir /tmp/peer --markdown --trl-threads 1
    .venv/bin/python bench/peer_trl.py --skip-trl --set trainer.dtype=bfloat16 --set inference.dtype=bfloat16
    .venv/bin/python bench/peer_trl.py --work-dir /tmp/peer --skip-trl --set placement.cpu_threads=2
    .venv/bin/python bench/peer_trl.py --skip-trl --backends torch,vllm
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
RUNNER = os.path.join(BENCH, "peer_trl_runner.py")
# The TRL side's versions: transformers and accelerate as in the project's venv, so both
# sides run the same model code; TRL and datasets as they resolved against them.
TORCH_PIN = "torch==2.13.0"
TRL_PINS = ("trl==1.16.0", "transformers==5.19.0", "accelerate==1.15.0", "datasets==5.2.0")
TARGET_SAMPLES_RATIO = 2.0
# workers.core.metric_names.REWARD_WINDOW, repeated so the pure helpers import nothing heavy;
# a test checks they agree.
WINDOW = 5
SIDES = ("trl", "sync", "async")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="trainer steps per side (≥ 3)")
    ap.add_argument("--target", type=float, default=0.20, help="reward the 5-step moving mean must reach")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="time budget per side (training only)")
    ap.add_argument("--batch-groups", type=int, default=8, help="prompts per step (B)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--length", type=int, default=64, help="characters per prompt string (the answer's length)")
    ap.add_argument("--max-new-tokens", type=int, default=72)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--reward", choices=("exact", "prefix", "position"), default="position")
    ap.add_argument("--seed", type=int, default=0, help="the RL runs' seed (sampling, prompts)")
    ap.add_argument(
        "--checkpoint-seed",
        type=int,
        default=0,
        help="the tiny checkpoint's and its warm start's seed: one starting point whatever --seed",
    )
    ap.add_argument("--warm-start-steps", type=int, default=100, help="supervised steps before RL (clean)")
    ap.add_argument("--warm-start-noisy-steps", type=int, default=0)
    ap.add_argument("--backends", default="torch", help="Rollway inference backends, comma list of torch,vllm")
    ap.add_argument("--skip-trl", action="store_true", help="Rollway only (no TRL venv, no TRL run)")
    ap.add_argument("--skip-rollway", action="store_true", help="TRL only")
    ap.add_argument("--trl-threads", type=int, default=None, help="torch threads in TRL's process (default: torch's)")
    ap.add_argument(
        "--trl-fp32",
        action="store_true",
        help="TRL with bf16 off (default: GRPOConfig's, bf16 mixed precision): a sensitivity setting",
    )
    ap.add_argument(
        "--set", action="append", default=[], help="override of the Rollway runs, e.g. placement.cpu_threads=2"
    )
    ap.add_argument("--quick", action="store_true", help="smoke test: 4 steps, B=4 × G=4, 20 warm-start steps")
    ap.add_argument("--venv", default=None, help="TRL's virtual environment (made if missing)")
    ap.add_argument("--work-dir", default=None, help="checkpoint, policy and scratch (default: a temp dir, removed)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown, a row per side")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch_groups, args.group_size = 4, 4, 4
        args.warm_start_steps, args.warm_start_noisy_steps = 20, 0
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse settings the figures cannot be made from, naming the flag."""
    errors = []
    if args.steps < 3:
        errors.append(f"--steps must be ≥ 3 (got {args.steps}): figures skip step 1 and need two more")
    if not 0 < args.target <= 1:
        errors.append(f"--target must be in (0, 1] (got {args.target}): rewards lie in [0, 1]")
    if args.max_minutes <= 0:
        errors.append(f"--max-minutes must be > 0 (got {args.max_minutes})")
    if args.batch_groups < 1:
        errors.append(f"--batch-groups must be ≥ 1 (got {args.batch_groups})")
    if args.group_size < 2:
        errors.append(f"--group-size must be ≥ 2 (got {args.group_size}): GRPO compares completions of a prompt")
    if args.length < 1:
        errors.append(f"--length must be ≥ 1 (got {args.length})")
    if args.max_new_tokens < args.length + 1:
        errors.append(
            f"--max-new-tokens ({args.max_new_tokens}) must be ≥ --length + 1 ({args.length + 1}): "
            "the answer and its EOS must fit"
        )
    if args.temperature <= 0 or args.lr <= 0:
        errors.append("--temperature and --lr must be > 0")
    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - {"torch", "vllm"}:
        errors.append(f"--backends must list torch and/or vllm (got {args.backends!r})")
    if args.skip_trl and args.skip_rollway:
        errors.append("--skip-trl and --skip-rollway together leave nothing to run")
    from workers.core.merge import OverrideError, parse_sets

    try:
        parse_sets(args.set)
    except OverrideError as exc:
        errors.append(str(exc))
    if errors:
        raise SystemExit("\n".join(errors))


# ---- figures (pure) ------------------------------------------------------------------


def moving_mean(values: list[float], window: int = WINDOW) -> list[float | None]:
    """Mean of the last `window` values at each index (None until there are `window`)."""
    return [sum(values[i + 1 - window : i + 1]) / window if i + 1 >= window else None for i in range(len(values))]


def time_to_target(
    rewards: list[float], times: list[float], target: float, window: int = WINDOW
) -> tuple[int, float] | None:
    """(step, seconds) of the first step whose `window`-step moving mean reward is ≥
    `target`; steps count from 1, `times[i]` is step i+1's end. None if never."""
    for i, m in enumerate(moving_mean(rewards, window)):
        if m is not None and m >= target:
            return i + 1, times[i]
    return None


def figures(
    times: list[float],
    rewards: list[float],
    samples_per_step: int,
    tokens: list[float],
    busy_inference: list[float],
    busy_trainer: list[float],
    target: float,
) -> dict:
    """One side's row from its per-step series (index i = step i+1): `times` are step
    ends from the start of training; `tokens` completion tokens per step; the busy
    lists are each step's busy seconds. Rates and fractions over steps 2..N."""
    n = len(times)
    span = times[-1] - times[0]
    reached = time_to_target(rewards, times, target)
    head = rewards[:WINDOW]
    tail = rewards[-WINDOW:]
    return {
        "steps": n,
        "samples_per_s": (n - 1) * samples_per_step / span,
        "tokens_per_s": sum(tokens[1:]) / span,
        "tokens_per_sample": sum(tokens) / (n * samples_per_step),
        "inference_busy": sum(busy_inference[1:]) / span,
        "trainer_busy": sum(busy_trainer[1:]) / span,
        "reward_start": sum(head) / len(head),
        "reward_end": sum(tail) / len(tail),
        "reward_best": max((m for m in moving_mean(rewards) if m is not None), default=None),
        "target_step": reached[0] if reached else None,
        "target_s": reached[1] if reached else None,
        "wall_s": times[-1],
        # per step, for the JSON: time to any other target can be read off afterwards
        "rewards": list(rewards),
        "times": list(times),
    }


def trl_figures(out: dict, samples_per_step: int, target: float) -> dict:
    """The TRL runner's per-step records → a row. Inference busy: time inside
    `model.generate`; trainer busy: the step less its whole rollout (forward, backward,
    optimizer); the rest (decoding, reward, advantages) is neither."""
    s = out["steps"]
    row = figures(
        [r["t"] for r in s],
        [r["reward"] for r in s],
        samples_per_step,
        [r["tokens"] for r in s],
        [r["gen_s"] for r in s],
        [r["step_s"] - r["rollout_s"] for r in s],
        target,
    )
    later = s[1:]
    row["phases"] = {
        "generate": sum(r["gen_s"] for r in later) / len(later),
        "rest of rollout": sum(r["rollout_s"] - r["gen_s"] for r in later) / len(later),
        "train": sum(r["step_s"] - r["rollout_s"] for r in later) / len(later),
        "between steps": (s[-1]["t"] - s[0]["t"] - sum(r["step_s"] for r in later)) / len(later),
    }
    return row


def rollway_figures(series: dict, samples_per_step: int, target: float) -> dict:
    """A Rollway run's series ({name: [(step, value)]}) → a row. A step's window is
    samples / samples/per_s (the trainer's time since its previous step, the first from
    the loops' start), so step ends are their running sum; busy seconds are the window
    times 1 − idle fraction; tokens the window times inference/tokens_per_s."""
    s = {k: dict(v) for k, v in series.items()}
    steps = sorted(s["samples/per_s"])
    windows = [samples_per_step / s["samples/per_s"][k] for k in steps]
    times, t = [], 0.0
    for w in windows:
        t += w
        times.append(t)

    def per_step(name: str, f) -> list[float]:
        return [f(s[name][k], w) if k in s.get(name, {}) else 0.0 for k, w in zip(steps, windows, strict=True)]

    row = figures(
        times,
        [s["reward/mean"][k] for k in steps],
        samples_per_step,
        per_step("inference/tokens_per_s", lambda v, w: v * w),
        per_step("inference/idle_frac", lambda v, w: (1 - v) * w),
        per_step("trainer/idle_frac", lambda v, w: (1 - v) * w),
        target,
    )
    n = len(steps) - 1
    row["phases"] = {
        "step (wall)": sum(windows[1:]) / n,
        "train": sum(s["trainer/step_s"][k] for k in steps[1:]) / n,
        "trainer waiting": sum(s["trainer/idle_frac"][k] * w for k, w in zip(steps[1:], windows[1:], strict=True)) / n,
    }
    row["dropped_stale"] = max(s["buffer/dropped_stale"].values(), default=0.0) if "buffer/dropped_stale" in s else 0.0
    return row


ROWS = (
    ("samples/s (steps 2..N)", "samples_per_s", "{:.1f}"),
    ("completion tokens/s", "tokens_per_s", "{:.0f}"),
    ("completion tokens/sample", "tokens_per_sample", "{:.1f}"),
    ("inference busy", "inference_busy", "{:.0%}"),
    ("trainer busy", "trainer_busy", "{:.0%}"),
    ("reward, first 5 steps", "reward_start", "{:.3f}"),
    ("reward, last 5 steps", "reward_end", "{:.3f}"),
    ("best 5-step mean reward", "reward_best", "{:.3f}"),
    ("step reaching target", "target_step", "{}"),
    ("time to target (s)", "target_s", "{:.1f}"),
    ("training wall time (s)", "wall_s", "{:.1f}"),
    ("start-up (s)", "startup_s", "{:.1f}"),
    ("load average (1 min)", "loadavg_1m", "{:.1f}"),
)


def format_table(results: dict[str, dict], rows=ROWS) -> str:
    """Rows are figures, columns sides; a missing figure (target never reached, a side
    not run) prints as '-'."""
    width = max(12, *(len(name) + 2 for name in results))
    label = max(len(r[0]) for r in rows) + 2
    lines = [" " * label + "".join(f"{name:>{width}}" for name in results)]
    for title, key, fmt in rows:
        cells = []
        for r in results.values():
            v = r.get(key)
            cells.append(f"{'-' if v is None else fmt.format(v):>{width}}")
        lines.append(f"{title:<{label}}" + "".join(cells))
    return "\n".join(lines)


def trl_label(trl_threads: int | None, trl_fp32: bool) -> str:
    """TRL's side as a table names it (bench/learning.py's `side_label` alike): "trl" at TRL's
    defaults, else what was changed and that it is a sensitivity setting, so a figure
    quoted from the row carries the setting with it."""
    changed = [f"--trl-threads {trl_threads}"] * (trl_threads is not None) + ["--trl-fp32"] * trl_fp32
    return "trl" if not changed else f"trl, {', '.join(changed)} (a sensitivity setting, not TRL's default)"


def markdown_table(results: dict[str, dict], target: float) -> str:
    """One row per side (a Markdown table for docs/benchmarks.md): throughput, its ratio to
    TRL's, time to `target`, rewards, busy fractions and the load the figure was
    taken under; '-' where a figure is missing."""

    def cell(r: dict, key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None else fmt.format(v)

    trl = results.get("trl")
    head = (
        "| side | samples/s | × TRL | completion tokens/s | time to reward "
        f"{target} (s, step) | training wall (s) | reward first 5 → last 5 steps | best 5-step mean "
        "| inference busy | trainer busy | load average |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for name, r in results.items():
        ratio = "-" if trl is None else f"{r['samples_per_s'] / trl['samples_per_s']:.2f}×"
        to_target = "not reached" if r.get("target_s") is None else f"{r['target_s']:.0f} (step {r['target_step']})"
        lines.append(
            f"| {r.get('label', name)} | {cell(r, 'samples_per_s', '{:.1f}')} | {ratio} "
            f"| {cell(r, 'tokens_per_s', '{:.0f}')} "
            f"| {to_target} | {cell(r, 'wall_s', '{:.0f}')} "
            f"| {cell(r, 'reward_start', '{:.3f}')} → {cell(r, 'reward_end', '{:.3f}')} "
            f"| {cell(r, 'reward_best', '{:.3f}')} | {cell(r, 'inference_busy', '{:.0%}')} "
            f"| {cell(r, 'trainer_busy', '{:.0%}')} | {cell(r, 'loadavg_1m', '{:.1f}')} |"
        )
    return "\n".join(lines)


def verdict(results: dict[str, dict], target: float) -> list[str]:
    """Each async run against TRL: samples/s ratio (≥ 2× wanted) and time to target."""
    trl = results.get("trl")
    if trl is None:
        return ["(no TRL run: no ratios)"]
    out = []
    for name, r in results.items():
        if not name.startswith("async"):
            continue
        ratio = r["samples_per_s"] / trl["samples_per_s"]
        line = (
            f"{name}/TRL samples/s: {ratio:.2f}× (target ≥ {TARGET_SAMPLES_RATIO:.0f}×: "
            f"{'met' if ratio >= TARGET_SAMPLES_RATIO else 'NOT met'})"
        )
        if r["target_s"] is not None and trl["target_s"] is not None:
            faster = r["target_s"] < trl["target_s"]
            line += (
                f"; time to reward {target}: {r['target_s']:.1f}s vs TRL {trl['target_s']:.1f}s "
                f"({'less' if faster else 'NOT less'})"
            )
        else:
            reached = [n for n, x in (("TRL", trl), (name, r)) if x["target_s"] is not None]
            line += f"; reward {target} reached by {', '.join(reached) or 'neither'} within the steps run"
        out.append(line)
    return out


# ---- the runs ------------------------------------------------------------------------


def task_section(args: argparse.Namespace) -> dict:
    return {"name": "copy", "min_len": args.length, "max_len": args.length, "reward": args.reward}


def make_policy(args: argparse.Namespace, work_dir: str) -> str:
    """The tiny Qwen2 checkpoint, warm-started by Rollway's supervised warm start; reused
    when `work_dir` already holds it. Returns the policy directory all sides load."""
    from workers.config.presets import build
    from workers.config.run_config import TaskConfig
    from workers.model.tiny_hf import make_tiny_checkpoint
    from workers.train.warmstart import policy_dir

    done = os.path.join(work_dir, "policy.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)["policy"]
    base = os.path.join(work_dir, "base")
    task = TaskConfig(**task_section(args))
    # No merges (vocabulary = 256 bytes + 5 special tokens): one token per character, so
    # a completion is as long in tokens as in characters.
    prompt_tokens = 24 + args.length  # ChatML header and footer (21 tokens) around the string and "="
    make_tiny_checkpoint(
        base, "qwen2", seed=args.checkpoint_seed, task=task, vocab_size=261,
        max_position_embeddings=prompt_tokens + args.max_new_tokens,
    )  # fmt: skip
    cfg = build(
        "sync",
        {
            "seed": args.checkpoint_seed,
            "model": {"source": "path", "path": base},
            "task": task_section(args),
            "inference": {"max_new_tokens": args.max_new_tokens},
            "warm_start": {"steps": args.warm_start_steps, "noisy_steps": args.warm_start_noisy_steps},
        },
    )
    t = time.perf_counter()
    path = policy_dir(cfg, os.path.join(work_dir, "warm"))
    print(f"warm start: {args.warm_start_steps}+{args.warm_start_noisy_steps} steps in {time.perf_counter() - t:.0f}s")
    with open(done, "w") as f:
        json.dump({"policy": path}, f)
    return path


def prompts_in_order(args: argparse.Namespace, n: int) -> list[dict]:
    """The prompts Rollway's (one) inference worker draws, in its order: TRL trains on
    the same sequence (workers/run/actors.py seeds the worker's generator this way)."""
    from workers.config.run_config import TaskConfig
    from workers.rl_tasks import make_task

    rng = random.Random(f"{args.seed}-prompts-0")
    return [{"prompt": p, "answer": a} for p, a in make_task(TaskConfig(**task_section(args))).sample(n, rng)]


def ensure_venv(venv: str) -> str:
    """TRL's virtual environment, made once: torch first and exact (pip would otherwise
    fetch a CUDA build), then TRL_PINS under a constraint pinning torch. Returns its python."""
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".peer-trl-pins")
    want = "\n".join((TORCH_PIN, *TRL_PINS))
    if os.path.exists(stamp) and open(stamp).read() == want:
        return python
    print(f"making TRL's venv in {venv} ({', '.join(TRL_PINS)}): a few minutes", flush=True)
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    constraints = os.path.join(venv, "constraints.txt")
    with open(constraints, "w") as f:
        f.write(TORCH_PIN + "\n")
    subprocess.run([*pip, "-c", constraints, *TRL_PINS], check=True)
    with open(stamp, "w") as f:
        f.write(want)
    return python


def trl_environment() -> dict[str, str]:
    """The TRL runner's environment: this one less the project's Python paths, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_trl(args: argparse.Namespace, python: str, policy: str, work_dir: str) -> dict:
    spec = {
        "model_dir": policy,
        "prompts": prompts_in_order(args, args.steps * args.batch_groups),
        "reward": args.reward,
        "batch_groups": args.batch_groups,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "clip_eps": 0.2,  # Rollway's trainer.clip_eps default
        "max_grad_norm": 1.0,  # Rollway's trainer.max_grad_norm default
        "seed": args.seed,
        "steps": args.steps,
        "max_minutes": args.max_minutes,
        "work_dir": work_dir,
        "threads": args.trl_threads,
        **({"precision": "fp32"} if args.trl_fp32 else {}),
    }
    spec_path, out_path = os.path.join(work_dir, "trl-spec.json"), os.path.join(work_dir, "trl-out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    t = time.perf_counter()
    done = subprocess.run(
        [python, RUNNER, spec_path, out_path], env=trl_environment(), cwd=work_dir, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"TRL runner failed ({done.returncode}):\n{done.stderr[-4000:]}")
    with open(out_path) as f:
        out = json.load(f)
    out["startup_s"] = time.perf_counter() - t - out["train_s"]
    return out


def rollway_overrides(args: argparse.Namespace, backend: str, policy: str) -> dict:
    """The overrides of a preset that make one Rollway side of the workload, `--set` last."""
    from workers.core.merge import deep_merge, parse_sets

    return deep_merge(workload_overrides(args, backend, policy), parse_sets(args.set))


def workload_overrides(args: argparse.Namespace, backend: str, policy: str) -> dict:
    return {
        "seed": args.seed,
        "model": {"source": "path", "path": policy},
        "task": task_section(args),
        "warm_start": {"steps": 0, "noisy_steps": 0},  # the policy is warm-started already
        "inference": {"backend": backend, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature},
        "trainer": {"lr": args.lr, "batch_groups": args.batch_groups, "group_size": args.group_size},
        "stop": {"max_steps": args.steps, "max_minutes": args.max_minutes},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="peer-trl-")
    os.makedirs(work_dir, exist_ok=True)
    samples = args.batch_groups * args.group_size
    results: dict[str, dict] = {}
    try:
        python = None
        if not args.skip_trl:
            home = os.environ.get("ROLLWAY_HOME", os.path.join(ROOT, "var"))
            python = ensure_venv(args.venv or os.path.join(home, "cache", "peer-trl-venv"))
        policy = make_policy(args, work_dir)
        from workers.model.tokenizer import load_tokenizer

        first_prompt = load_tokenizer(policy).prompt_ids(prompts_in_order(args, 1)[0]["prompt"])
        if python:
            out = run_trl(args, python, policy, work_dir)
            if out["first_prompt_ids"] != first_prompt:
                raise SystemExit(
                    f"TRL and Rollway tokenise the first prompt differently:\n{out['first_prompt_ids']}\n{first_prompt}"
                )
            row = trl_figures(out, samples, args.target)
            row.update(startup_s=out["startup_s"], loadavg_1m=os.getloadavg()[0], versions=out["versions"])
            label = trl_label(args.trl_threads, args.trl_fp32)
            row.update(label=label, precision=out["precision"], threads=out["threads"])
            results["trl"] = row
            _say("trl", row, f"torch threads {out['threads']}, mixed precision {out['precision']}; {out['versions']}")
        if not args.skip_rollway:
            results.update(run_rollway(args, policy, work_dir, samples))
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)

    print(
        f"\nworkload: copy {args.length} chars (reward {args.reward}), B={args.batch_groups} × G={args.group_size}, "
        f"max_new_tokens={args.max_new_tokens}, temperature={args.temperature}, lr={args.lr}, seed={args.seed}, "
        f"{args.steps} steps; target: {WINDOW}-step moving mean reward ≥ {args.target}; "
        f"host: {os.cpu_count()} cores"
    )
    print(format_table(results))
    print()
    for line in verdict(results, args.target):
        print(line)
    print("\nwhere a step's time goes (seconds per step, steps 2..N):")
    for name, r in results.items():
        print(f"  {name:12} " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items()))
    if args.markdown:
        print()
        print(markdown_table(results, args.target))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2, default=str)
    return 0


def run_rollway(args: argparse.Namespace, policy: str, work_dir: str, samples: int) -> dict[str, dict]:
    import ray
    from sync_vs_async import run_mode

    from workers.core.run_actors import NAMESPACE
    from workers.run.paths import Confinement

    confinement = Confinement.from_lists([work_dir], [], scratch_root=os.path.join(work_dir, "scratch"))
    results = {}
    # address="local": a Ray of its own even where another one runs on the host.
    from workers.core.run_actors import init_local_ray

    init_local_ray(NAMESPACE)
    try:
        for i, backend in enumerate(b for b in args.backends.split(",") if b):
            for j, mode in enumerate(("sync", "async")):
                name = mode if backend == "torch" else f"{mode}-{backend}"
                t = time.perf_counter()
                out = run_mode(
                    mode,
                    rollway_overrides(args, backend, policy),
                    os.path.join(work_dir, "cache"),
                    run_id=970_000 + 10 * i + j,
                    confinement=confinement,
                )
                row = rollway_figures(out["series"], samples, args.target)
                row["startup_s"] = time.perf_counter() - t - row["wall_s"]
                row["loadavg_1m"] = os.getloadavg()[0]
                results[name] = row
                _say(name, row, f"phases {', '.join(f'{k} {v:.1f}s' for k, v in out['timings'].items())}")
    finally:
        ray.shutdown()
    return results


def _say(name: str, row: dict, extra: str) -> None:
    print(
        f"[{name}] {row['steps']} steps, {row['wall_s']:.0f}s training: {row['samples_per_s']:.1f} samples/s, "
        f"reward {row['reward_start']:.3f} → {row['reward_end']:.3f} ({extra}; "
        f"load average {row['loadavg_1m']:.1f})",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
