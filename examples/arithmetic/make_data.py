"""Write the example's dataset, arithmetic.jsonl, beside this file (seeded: the same rows
each time).

    python -m examples.arithmetic.make_data [--rows 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random

from examples.arithmetic.task import question

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arithmetic.jsonl")


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(f"arithmetic-{seed}")
    return [question(rng) for _ in range(n)]


def write(path: str = PATH, n: int = 300, seed: int = 0) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows(n, seed))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(PATH, args.rows, args.seed))


if __name__ == "__main__":
    main()
