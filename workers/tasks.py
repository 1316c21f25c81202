"""Synthetic tasks with verifiable rewards, small enough for a tiny model to learn on CPU.

`reverse`: the prompt is a random string followed by "=", the answer is the string
reversed ("abc=" → "cba", then EOS). The reward gives per-position partial credit,
which is a much denser signal for GRPO than exact match: with exact match almost every
group of a weak policy scores all zeros and has no advantage to learn from.
"""

from __future__ import annotations

import random
from typing import Protocol

from workers.config import TaskConfig


class Task(Protocol):
    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """`n` (prompt text, answer) pairs."""
        ...

    def reward(self, completion_text: str, answer: str) -> float:
        """Score in [0, 1] of a decoded completion (EOS and after already stripped)."""
        ...


class ReverseTask:
    """Reverse a string of `min_len`..`max_len` characters drawn from `alphabet`."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        out = []
        for _ in range(n):
            length = rng.randint(self.cfg.min_len, self.cfg.max_len)
            text = "".join(rng.choice(self.cfg.alphabet) for _ in range(length))
            out.append((text + "=", text[::-1]))
        return out

    def reward(self, completion_text: str, answer: str) -> float:
        """Fraction of positions right, over the longer of completion and answer.

        A completion that is too long or too short loses the positions it gets wrong,
        so the policy learns to stop (emit EOS) at the right length as well.
        """
        denom = max(len(completion_text), len(answer))
        if denom == 0:
            return 1.0
        hits = sum(a == b for a, b in zip(completion_text, answer))
        return hits / denom


def make_task(task_cfg: TaskConfig) -> Task:
    """The task named by `task.name`."""
    if task_cfg.name == "reverse":
        return ReverseTask(task_cfg)
    raise ValueError(f"unknown task.name {task_cfg.name!r}; choose 'reverse'")
