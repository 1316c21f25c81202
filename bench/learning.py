"""The learning benchmark: does GRPO make the model better on prompts it never trained on?

Per task (`RECIPES`: countdown, countdown-file, gsm8k, ...), one small real checkpoint (workers/model/tiny_hf.py: a
tiny Qwen2 with a byte-level tokenizer without merges, one token per character) is
warm-started once by Rollway's supervised warm start (workers/train/warmstart.py) to partial
competence on held-out prompts. From those same weights, for each seed, Rollway `sync`,
Rollway `async` (the real run driver and actors on in-process Ray, as
bench/sync_vs_async.py runs them) and TRL's GRPOTrainer (bench/peer_trl_runner.py in its
own venv, as bench/peer_trl.py makes it) run GRPO with the same hyperparameters, on the
same training prompts in the same order.

Held-out pass@1 is measured the same way for every side: workers.rollout.evaluation.evaluate on
the torch backend, the task's held-out problems (a share of the generator's problems
that training and the warm start never draw: workers/rollout/evaluation.py), `eval.k`
completions each at temperature 1, the run's seed as the sampling seed. Before: the
warm-started checkpoint. After: Rollway's end-of-run eval pass, and for TRL the same
evaluation of the weights it saved after its last step (and every `eval.every_steps`,
for the curve).

Printed per task: a row per side with held-out pass@1 before → after (mean ± standard
deviation over seeds, and each seed's), samples trained on, and the training wall time
(Rollway: its loops, eval passes included; TRL: `train()`'s steps, saves excluded);
then each side's held-out pass@1 at each eval point, mean over seeds.

TRL's process runs on torch's default threads (one per core) and GRPOConfig's default
precision (bf16 mixed precision: accelerate's bf16 autocast on the CPU), as a user's
would. `--trl-threads N` holds it to N threads and `--trl-fp32` turns its bf16 off
(Rollway's float32): sensitivity settings, and TRL's rows say so.

    .venv/bin/python bench/learning.py --task countdown              # 3 seeds × sync, async, TRL
    .venv/bin/python bench/learning.py --task gsm8k --sides sync,async
    .venv/bin/python bench/learning.py --task countdown --seeds 0 --set trainer.lr=0  # no learning: no gain

The checkpoint and the TRL venv are kept under --work-dir (reused on the next run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
SIDES = ("sync", "async", "trl")

# Each task's settings: the checkpoint, its warm start, GRPO's settings and the eval. The
# warm start is clean supervised steps only, in stages (each stage a warm start of its
# own on the previous stage's policy, so a stage can be added without rebuilding the
# ones before it). Held-out figures of each: docs/learning.md.
RECIPES: dict[str, dict] = {
    "countdown": {
        # Two numbers (≤ 20; 73 held-out problems): a 2-layer model learns to copy them
        # and pick the operator. At the warm start's default lr (3e-3) whether it does
        # depends on the order of its batches (one order: held-out 0.04 after 500 steps,
        # another 0.36); at 1e-3 it learns steadily (0.18 at 100 steps, 0.48 at 200), so
        # 120 steps leave it partly competent (0.27), with room for GRPO to raise it. GRPO
        # at lr 1e-3 collapses it (0.0 after 40 steps on one seed); 3e-4 raises it.
        "task": {"name": "countdown", "options": {"count": 2}},
        "max_position_embeddings": 64,
        "max_new_tokens": 16,
        "warm_start": [{"steps": 120, "lr": 1e-3, "noisy_steps": 0}],
        "trainer": {"lr": 3e-4, "batch_groups": 16, "group_size": 8},
        "steps": 60,
        "eval": {"every_steps": 20, "num_prompts": 64, "k": 8},
    },
    "countdown-file": {
        # The shipped data/countdown.jsonl (4,000 rows; three numbers ≤ 20), a fifth of it
        # held out: no generator behind it, so held-out pass@1 is a fixed set of rows.
        # Three numbers are harder than two: the warm start at lr 1e-3 reaches held-out
        # 0.06 after 200 steps, 0.14 after 400 and 0.2 after 800 (from the first 300
        # rows instead, 0.16 after 800: docs/learning.md).
        "task": {
            "name": "countdown",
            "dataset": {"path": os.path.join(ROOT, "data", "countdown.jsonl"), "eval_fraction": 0.2},
        },
        "max_position_embeddings": 64,
        "max_new_tokens": 16,
        "warm_start": [{"steps": n, "lr": 1e-3, "noisy_steps": 0} for n in (200, 200, 400)],
        "trainer": {"lr": 3e-4, "batch_groups": 16, "group_size": 8},
        "steps": 60,
        "eval": {"every_steps": 20, "num_prompts": 64, "k": 8},
    },
    "gsm8k-file": {
        # The shipped data/gsm8k.jsonl (4,000 rows; one operation on numbers ≤ 20), a
        # fifth held out by row: a held-out row's arithmetic may appear in training in
        # other words, so this measures reading new wordings as much as new facts. The
        # warm start at lr 1e-3 reaches held-out 0.04, 0.09, 0.20, 0.48 after 200, 400,
        # 600, 800 steps; from 600, GRPO at lr 3e-5 raises it (docs/learning.md).
        "task": {
            "name": "gsm8k",
            "dataset": {"path": os.path.join(ROOT, "data", "gsm8k.jsonl"), "eval_fraction": 0.2},
        },
        "max_position_embeddings": 112,
        "max_new_tokens": 16,
        "warm_start": [{"steps": n, "lr": 1e-3, "noisy_steps": 0} for n in (200, 200, 200)],
        "trainer": {"lr": 3e-5, "batch_groups": 16, "group_size": 8},
        "steps": 60,
        "eval": {"every_steps": 20, "num_prompts": 64, "k": 8},
    },
    "gsm8k": {
        # Two operations on numbers ≤ 9, the second on the first's result: a held-out
        # problem is a chain training never shows, of facts it shows in other chains. The
        # warm start at lr 1e-3 memorises the training chains first (held-out 0.03-0.05
        # for 300 steps) and then composes (0.15 at 500, 0.32 at 600, 0.54 at 700 steps):
        # 600 leave it partly competent (docs/learning.md). GRPO at countdown's lr (3e-4)
        # knocks it down (0.32 -> 0.18 in 60 steps); at 3e-5 it raises it.
        "task": {"name": "gsm8k", "options": {"max_number": 9, "steps": 2}},
        "max_position_embeddings": 128,
        "max_new_tokens": 24,
        "warm_start": [{"steps": 100, "lr": 1e-3, "noisy_steps": 0}] * 6,
        "trainer": {"lr": 3e-5, "batch_groups": 16, "group_size": 8},
        "steps": 60,
        "eval": {"every_steps": 20, "num_prompts": 64, "k": 8},
    },
    "gsm8k-one-step": {
        # One operation on numbers ≤ 9: a held-out problem is an arithmetic fact training
        # never shows in any wording. After 400 steps at lr 1e-3 the model gets 0.23-0.25
        # of them (0.08 at 200 steps: it memorises the training facts first); GRPO does
        # not raise that (docs/learning.md).
        "task": {"name": "gsm8k", "options": {"max_number": 9}},
        "max_position_embeddings": 112,
        "max_new_tokens": 16,
        "warm_start": [{"steps": 400, "lr": 1e-3, "noisy_steps": 0}],
        "trainer": {"lr": 3e-4, "batch_groups": 16, "group_size": 8},
        "steps": 60,
        "eval": {"every_steps": 20, "num_prompts": 32, "k": 8},
    },
}
CHECKPOINT_SEED = 0  # one checkpoint per task: every side and seed starts from it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(RECIPES), default="countdown")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of RL seeds")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma list of sync, async, trl")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per run (default: the recipe's)")
    ap.add_argument("--set", action="append", default=[], help="override of the Rollway runs, e.g. trainer.lr=1e-4")
    ap.add_argument("--max-minutes", type=float, default=10.0, help="time budget per run (training only)")
    ap.add_argument(
        "--trl-threads",
        type=int,
        default=None,
        help="torch threads in TRL's process (default: torch's, one per core; any other count is a sensitivity "
        "setting, labelled as such)",
    )
    ap.add_argument(
        "--trl-fp32",
        action="store_true",
        help="TRL with bf16 off (default: GRPOConfig's, bf16 mixed precision): a sensitivity setting, labelled",
    )
    ap.add_argument("--venv", default=None, help="TRL's virtual environment (made if missing)")
    ap.add_argument("--work-dir", default=os.path.join(ROOT, "var", "bench-learning"))
    ap.add_argument(
        "--policy",
        default=None,
        help="a warm-started policy directory to start from instead of building the recipe's (it must not have "
        "trained on the task's held-out problems: one built by workers/train/warmstart.py with eval on has not)",
    )
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    errors = []
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        args.seed_list = []
    if not args.seed_list:
        errors.append(f"--seeds must be a comma list of integers (got {args.seeds!r})")
    args.side_list = [s for s in args.sides.split(",") if s]
    if not args.side_list or set(args.side_list) - set(SIDES):
        errors.append(f"--sides must list some of {', '.join(SIDES)} (got {args.sides!r})")
    if args.steps is not None and args.steps < 1:
        errors.append(f"--steps must be ≥ 1 (got {args.steps})")
    if args.trl_threads is not None and args.trl_threads < 1:
        errors.append(f"--trl-threads must be ≥ 1 (got {args.trl_threads}); leave it out for torch's default")
    if errors:
        raise SystemExit("\n".join(errors))
    return args


# ---- figures (pure) ------------------------------------------------------------------


def spread(values: list[float], digits: int = 3) -> str:
    """`mean ± sd` (sd over seeds; 0 for one seed)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def side_label(side: str, trl_threads: int | None, trl_fp32: bool = False) -> str:
    """The side's name in the tables: TRL off its default threads or precision says so,
    so a figure quoted from the row carries the setting with it. (bench/peer_trl.py's
    `trl_label` words it the same; this module is also imported by path, without
    bench/ on sys.path, so it does not import that one at its top.)"""
    changed = [f"--trl-threads {trl_threads}"] * (trl_threads is not None) + ["--trl-fp32"] * trl_fp32
    if side != "trl" or not changed:
        return side
    return f"trl, {', '.join(changed)} (a sensitivity setting, not TRL's default)"


def table(rows: dict[str, list[dict]]) -> str:
    """A Markdown row per side from its runs (one per seed): held-out pass@1 before →
    after, mean ± sd and per seed; the gain; samples trained on; wall time."""
    head = (
        "| side | seeds | held-out pass@1 before → after (mean ± sd) | per seed | gain (mean, min) "
        "| samples seen | training wall time (s) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for side, runs in rows.items():
        before = [r["before"] for r in runs]
        after = [r["after"] for r in runs]
        gains = [a - b for a, b in zip(after, before, strict=True)]
        seeds = ", ".join(str(r["seed"]) for r in runs)
        per_seed = ", ".join(f"{b:.3f}→{a:.3f}" for b, a in zip(before, after, strict=True))
        lines.append(
            f"| {side} | {seeds} | {spread(before)} → {spread(after)} | {per_seed} "
            f"| {statistics.mean(gains):+.3f}, {min(gains):+.3f} | {runs[0]['samples']} "
            f"| {spread([r['wall_s'] for r in runs], digits=0)} |"
        )
    return "\n".join(lines)


def curves(rows: dict[str, list[dict]]) -> str:
    """Held-out pass@1 at each eval point (step: samples seen), mean over seeds."""
    lines = []
    for side, runs in rows.items():
        steps = sorted(set.intersection(*(set(r["curve"]) for r in runs)))
        points = ", ".join(f"{s}: {statistics.mean(r['curve'][s] for r in runs):.3f}" for s in steps)
        lines.append(f"  {side:6} {points}")
    return "\n".join(lines)


# ---- the runs ------------------------------------------------------------------------


def recipe_overrides(recipe: dict, policy: str, seed: int, steps: int, extra: dict) -> dict:
    """The overrides of a preset that make one Rollway run of `recipe` from `policy`."""
    from workers.core.merge import deep_merge

    cfg = {
        "seed": seed,
        "task": recipe["task"],
        "inference": {"backend": "torch", "max_new_tokens": recipe["max_new_tokens"], "temperature": 1.0},
        "trainer": recipe["trainer"],
        "eval": recipe["eval"],
        "stop": {"max_steps": steps},
        "model": {"source": "path", "path": policy},
        "warm_start": {"steps": 0, "noisy_steps": 0},  # the policy is warm-started already
    }
    return deep_merge(cfg, extra)


def recipe_config(recipe: dict, policy: str, seed: int, steps: int, mode: str, extra: dict):
    """The RunConfig of one run of `recipe` (preset `mode`) from `policy`."""
    from workers.config.presets import build

    return build(mode, recipe_overrides(recipe, policy, seed, steps, extra))


def make_policy(recipe: dict, work_dir: str) -> str:
    """The task's tiny Qwen2 checkpoint, warm-started; reused when already built."""
    from workers.config.run_config import TaskConfig
    from workers.model.tiny_hf import make_tiny_checkpoint
    from workers.train.warmstart import policy_dir

    base = os.path.join(work_dir, "base")
    if not os.path.exists(os.path.join(base, "config.json")):
        # No merges (256 bytes + 5 special tokens): one token per character, digits included.
        make_tiny_checkpoint(
            base, "qwen2", seed=CHECKPOINT_SEED, task=TaskConfig(**recipe["task"]), vocab_size=261,
            max_position_embeddings=recipe["max_position_embeddings"],
        )  # fmt: skip
    path = base
    for stage in recipe["warm_start"]:
        # Eval on: the warm start draws through the same held-out exclusion as the runs.
        cfg = recipe_config(recipe, path, CHECKPOINT_SEED, 1, "sync", {"warm_start": stage})
        t = time.perf_counter()
        path = policy_dir(cfg, os.path.join(work_dir, "warm"))
        print(f"warm start {stage}: {time.perf_counter() - t:.0f}s → {path}", flush=True)
    return path


def held_out_pass_at_1(cfg, model_dir: str) -> float:
    """Held-out pass@1 of the weights in `model_dir`, as a run's eval pass computes it."""
    from workers.inference.backends import make_backend
    from workers.model.tokenizer import load_tokenizer
    from workers.rl_tasks import make_task
    from workers.rollout.evaluation import PASS_AT_1, eval_prompts, evaluate

    task = make_task(cfg.task)
    backend = make_backend(cfg, model_dir)
    try:
        metrics = evaluate(
            backend, task, load_tokenizer(model_dir), eval_prompts(cfg, task), cfg.eval,
            cfg.inference.max_new_tokens, cfg.seed,
        )  # fmt: skip
    finally:
        backend.close()
    return metrics[PASS_AT_1]


def training_prompts_in_order(cfg, n_steps: int) -> list[dict]:
    """The prompts Rollway's one inference worker draws, batch after batch, held-out
    problems excluded (workers/run/actors.py): TRL trains on the same sequence."""
    from workers.rl_tasks import make_task
    from workers.rollout.evaluation import training_prompts

    task = make_task(cfg.task)
    source = training_prompts(cfg, task, task)
    rng = random.Random(f"{cfg.seed}-prompts-0")
    return [{"prompt": p, "answer": a} for _ in range(n_steps) for p, a in source.sample(cfg.trainer.batch_groups, rng)]


def run_rollway(mode: str, extra: dict, recipe: dict, policy: str, work_dir: str, seed: int, steps: int, run_id: int):
    from sync_vs_async import run_mode

    from workers.rollout.evaluation import PASS_AT_1
    from workers.run.paths import Confinement

    roots = [work_dir, os.path.dirname(os.path.abspath(policy))]
    confinement = Confinement.from_lists(
        roots, [], scratch_root=os.path.join(work_dir, "scratch"), data_roots=[os.path.join(ROOT, "data")]
    )
    overrides = recipe_overrides(recipe, policy, seed, steps, extra)
    out = run_mode(mode, overrides, os.path.join(work_dir, "cache"), run_id=run_id, confinement=confinement)
    cfg = out["config"]
    curve = {int(k): float(v) for k, v in out["series"].get(PASS_AT_1, [])}
    return {
        "seed": seed,
        "after": curve[max(curve)],
        "curve": curve,
        "samples": out["steps"] * cfg.trainer.batch_groups * cfg.trainer.group_size,
        "wall_s": out["wall_s"],
    }


def run_trl(cfg, recipe: dict, policy: str, work_dir: str, python: str, args, steps: int) -> dict:
    from peer_trl import trl_environment

    out_dir = os.path.join(work_dir, f"trl-seed{cfg.seed}")
    spec = {
        "model_dir": policy,
        "prompts": training_prompts_in_order(cfg, steps),
        "task": cfg.task.model_dump(mode="json", include={"name", "options"}),
        "reward": "exact",  # unused: the task's own reward scores
        "batch_groups": cfg.trainer.batch_groups,
        "group_size": cfg.trainer.group_size,
        "max_new_tokens": cfg.inference.max_new_tokens,
        "temperature": cfg.inference.temperature,
        "lr": cfg.trainer.lr,
        "clip_eps": cfg.trainer.clip_eps,
        "max_grad_norm": cfg.trainer.max_grad_norm,
        "seed": cfg.seed,
        "steps": steps,
        "max_minutes": args.max_minutes,
        "work_dir": out_dir,
        "threads": args.trl_threads,
        **({"precision": "fp32"} if args.trl_fp32 else {}),
        "save_every": cfg.eval.every_steps,
        "save_dir": os.path.join(out_dir, "saved"),
    }
    os.makedirs(out_dir, exist_ok=True)
    spec_path, out_path = os.path.join(out_dir, "spec.json"), os.path.join(out_dir, "out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    import subprocess

    done = subprocess.run(
        [python, os.path.join(BENCH, "peer_trl_runner.py"), spec_path, out_path],
        env=trl_environment(), cwd=out_dir, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"TRL runner failed ({done.returncode}):\n{done.stderr[-4000:]}")
    with open(out_path) as f:
        out = json.load(f)
    curve = {k: held_out_pass_at_1(cfg, os.path.join(spec["save_dir"], f"step-{k}")) for k in out["saved"]}
    return {
        "seed": cfg.seed,
        "after": curve[max(curve)],
        "curve": curve,
        "samples": len(out["steps"]) * cfg.trainer.batch_groups * cfg.trainer.group_size,
        "wall_s": out["steps"][-1]["t"],
        "threads": out["threads"],
        "precision": out["precision"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, BENCH)
    from workers.core.merge import parse_sets

    recipe = RECIPES[args.task]
    steps = args.steps or recipe["steps"]
    overrides = parse_sets(args.set)
    work_dir = os.path.join(args.work_dir, args.task)
    os.makedirs(work_dir, exist_ok=True)
    policy = args.policy or make_policy(recipe, work_dir)
    python = None
    if "trl" in args.side_list:
        from peer_trl import ensure_venv

        home = os.environ.get("ROLLWAY_HOME", os.path.join(ROOT, "var"))
        python = ensure_venv(args.venv or os.path.join(home, "cache", "peer-trl-venv"))

    rows: dict[str, list[dict]] = {side: [] for side in args.side_list}
    rollway_sides = [s for s in args.side_list if s != "trl"]
    import ray

    from workers.core.run_actors import NAMESPACE

    if rollway_sides:
        from workers.core.run_actors import init_local_ray

        init_local_ray(NAMESPACE)
    try:
        for seed in args.seed_list:
            sync_cfg = recipe_config(recipe, policy, seed, steps, "sync", overrides)
            before = held_out_pass_at_1(sync_cfg, policy)
            for i, side in enumerate(args.side_list):
                t = time.perf_counter()
                if side == "trl":
                    try:
                        row = run_trl(sync_cfg, recipe, policy, work_dir, python, args, steps)
                    except SystemExit as exc:  # the Rollway sides' figures still stand
                        print(f"[{args.task} trl seed {seed}] failed: {exc}", flush=True)
                        continue
                else:
                    run_id = 960_000 + 10 * seed + i
                    row = run_rollway(side, overrides, recipe, policy, work_dir, seed, steps, run_id)
                row["before"] = before
                row["curve"] = {0: before, **row["curve"]}
                rows[side].append(row)
                print(
                    f"[{args.task} {side} seed {seed}] held-out pass@1 {before:.3f} → {row['after']:.3f} "
                    f"({row['samples']} samples, {row['wall_s']:.0f}s training, {time.perf_counter() - t:.0f}s "
                    f"in all; load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        if rollway_sides:
            ray.shutdown()

    print(
        f"\n{args.task}: recipe {json.dumps({**recipe, 'steps': steps})}; overrides {json.dumps(overrides)}; "
        f"host {os.cpu_count()} cores"
    )
    if rows.get("trl"):
        held = "torch's default" if args.trl_threads is None else "--trl-threads, a sensitivity setting"
        mixed = "GRPOConfig's default" if not args.trl_fp32 else "--trl-fp32, a sensitivity setting"
        trl = rows["trl"][0]
        print(f"TRL's process: {trl['threads']} torch threads ({held}), mixed precision {trl['precision']} ({mixed})")
    labelled = {side_label(side, args.trl_threads, args.trl_fp32): runs for side, runs in rows.items() if runs}
    print(table(labelled))
    print("\nheld-out pass@1 by step (mean over seeds):")
    print(curves(labelled))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "recipe": recipe, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
