"""The small datasets shipped in the repository's `data/`, written from the built-in
tasks' generators so tests and the demo need nothing from outside.

    python -m workers.rollout.shipped_data [DIR] [--rows 4000] [--seed 0]

Each file is JSONL with `prompt` and `answer` columns (the columns `task.dataset`
reads by default), deterministic for a given seed: running it again rewrites the same
bytes. Countdown rows carry a `solution` too (one correct expression), for people
reading the file; the reward never reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from workers.config.run_config import TaskConfig
from workers.rl_tasks import make_task
from workers.rl_tasks.countdown import CountdownTask

# Rows per file: enough to generalise from. Warm-started on a file's training split
# (lr 1e-3, 800 steps; bench/learning.py's countdown-file recipe), the tiny model solves
# 0.215 of countdown's held-out rows from 4,000 rows (3,200 to train on) and 0.156 from
# the first 300 (240): docs/learning.md.
ROWS = 4000
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")
# Task configs of the shipped files: each fits the tiny model's default 64 positions
# except gsm8k, whose word problems need model.max_position_embeddings ≥ 80 or so.
SHIPPED = {
    "countdown": TaskConfig(name="countdown"),
    "gsm8k": TaskConfig(name="gsm8k"),
    "reverse": TaskConfig(name="reverse"),
}


def write(directory: str, rows: int = ROWS, seed: int = 0) -> list[str]:
    """Write `<name>.jsonl` for every shipped task into `directory`; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, task_cfg in SHIPPED.items():
        task = make_task(task_cfg)
        pairs = task.sample(rows, random.Random(f"shipped-{name}-{seed}"))
        path = os.path.join(directory, f"{name}.jsonl")
        with open(path, "w") as f:
            for prompt, answer in pairs:
                row = {"prompt": prompt, "answer": answer}
                if isinstance(task, CountdownTask):
                    row["solution"] = task.demonstration(prompt, answer)
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the shipped task datasets (JSONL).")
    parser.add_argument("directory", nargs="?", default=DATA_DIR)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write(args.directory, args.rows, args.seed):
        print(path)


if __name__ == "__main__":
    main()
