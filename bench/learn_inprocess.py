"""Does RL learn here? A synchronous in-process GRPO loop on the torch backend.

generate B×G rollouts (TorchBackend) → Trainer.train_step → load_weights, repeated, with
torch on one thread (as in a Ray worker). Prints per-step reward and wall time, and the
step/second at which the moving-average reward first reaches the target.

    .venv/bin/python bench/learn_inprocess.py                     # the `async` preset's defaults
    .venv/bin/python bench/learn_inprocess.py --set trainer.lr=3e-3 --set warm_start.steps=20
    ROLLWAY_TASK_MODULES=examples.arithmetic.task .venv/bin/python bench/learn_inprocess.py \
        --launch-file examples/arithmetic/run.yaml --preset sync      # a launch file's run, synchronously

Prompts come from the task's generator, or from `task.dataset`'s train split where the
config names one; with `task.reward_funcs`, each function's rewards/<name>/mean over the
first and last `--window` steps is printed at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from rollway_cli.launchfile import launch_body
from workers.config.presets import build
from workers.core.merge import deep_merge, parse_sets
from workers.core.metric_names import REWARD_FUNC_PREFIX
from workers.inference.torch_backend import TorchBackend
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rollout.generation import generate_groups
from workers.rollout.task_data import train_prompts
from workers.train.trainer import Trainer
from workers.train.warmstart import policy_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, help="the preset (default: the launch file's, else async)")
    ap.add_argument("--launch-file", type=Path, help="a `rollway launch` YAML file: its preset and overrides")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. trainer.lr=3e-3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--window", type=int, default=5, help="moving-average window (steps)")
    ap.add_argument("--max-seconds", type=float, default=240.0)
    ap.add_argument("--max-steps", type=int, default=10_000)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
    ap.add_argument("--quiet", action="store_true", help="print every 10th step only")
    ap.add_argument(
        "--lag", type=int, default=0, help="train on batches generated this many versions ago (1 = one-step-off async)"
    )
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    body = launch_body(args.launch_file, []) if args.launch_file else {}
    preset = args.preset or body.get("preset") or "async"
    cfg = build(preset, deep_merge(body.get("overrides") or {}, parse_sets(args.set)))
    t = time.perf_counter()
    model_dir = policy_dir(cfg, args.cache_dir)
    print(f"warm start: {time.perf_counter() - t:.1f}s → {model_dir}")
    tokenizer = CharTokenizer.load(model_dir)
    task = make_task(cfg.task)
    backend = TorchBackend(model_dir)
    trainer = Trainer(cfg, model_dir)
    source = train_prompts(cfg, task)  # the dataset's train split, or the task's generator
    rng = random.Random(cfg.seed)
    per_func: dict[str, list[float]] = {}

    rewards: list[float] = []
    reached = None
    pending: list = []  # generated batches not yet trained on (--lag)
    start = time.perf_counter()
    step = 0
    gen_seed = 0
    while step < args.max_steps and time.perf_counter() - start < args.max_seconds:
        t_gen = time.perf_counter()
        while len(pending) <= args.lag:
            prompts = source.sample(cfg.trainer.batch_groups, rng)
            pending.append(
                generate_groups(
                    backend, task, tokenizer, prompts, cfg, trainer.version, seed=cfg.seed * 100_003 + gen_seed
                )
            )
            gen_seed += 1
        gen_s = time.perf_counter() - t_gen
        m = trainer.train_step(pending.pop(0))
        backend.load_weights(trainer.state_dict())
        rewards.append(m["reward/mean"])
        for name, value in m.items():
            if name.startswith(REWARD_FUNC_PREFIX) and name.endswith("/mean"):
                per_func.setdefault(name, []).append(value)
        avg = sum(rewards[-args.window :]) / len(rewards[-args.window :])
        wall = time.perf_counter() - start
        if not args.quiet or step % 10 == 0:
            print(
                f"step {step:4d}  t={wall:6.1f}s  reward={m['reward/mean']:.3f}  avg{args.window}={avg:.3f}  "
                f"gen={gen_s * 1000:.0f}ms train={m['trainer/step_s'] * 1000:.0f}ms  "
                f"loss={m['loss']:+.4f}  kl={m['mismatch/kl']:.1e}  stale={m['staleness/mean']:.0f}  "
                f"is={m['is/ratio_mean']:.3f}",
                flush=True,
            )
        step += 1
        if len(rewards) >= args.window and avg >= args.target:
            reached = (step, wall)
            break
    print(f"start reward (step 0): {rewards[0]:.3f}")
    for name, values in per_func.items():
        first, last = values[: args.window], values[-args.window :]
        print(
            f"{name}: first {len(first)} steps {sum(first) / len(first):.3f}, "
            f"last {len(last)} {sum(last) / len(last):.3f}"
        )
    if reached:
        print(f"REACHED avg{args.window} ≥ {args.target} at step {reached[0]} in {reached[1]:.1f}s")
        return 0
    print(f"NOT reached: last avg{args.window} = {avg:.3f} after {step} steps, {time.perf_counter() - start:.1f}s")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
