"""`task.name: dataset`: a run's prompts and rewards from its data alone.

What a TRL `GRPOTrainer` script holds is a dataset and reward functions, nothing else:
no generator to sample problems from, no demonstration to warm-start on, no lengths a
task knows in advance. This task is that. Its prompts (and every column the reward
functions read) come from `task.dataset`, its reward is `task.reward_funcs`' weighted
sum; the run's checks (workers/run/runnable.py) refuse it without either. Without a
demonstration the supervised warm start has nothing to teach, so it is off unless the
config asks for one (`RunConfig` fills `warm_start` with zeros for this task), and asking
for one is refused naming the fields.
"""

from __future__ import annotations

import random

from workers.rl_tasks import TaskSettings

NAME = "dataset"


class DatasetTask:
    """Prompts from `task.dataset`, rewards from `task.reward_funcs`."""

    dataset_only = True

    def __init__(self, cfg: TaskSettings) -> None:
        self.cfg = cfg

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        raise RuntimeError(f"task {NAME!r} samples nothing of its own: its prompts are task.dataset's rows")

    def reward(self, completion_text: str, answer: str) -> float:
        raise RuntimeError(f"task {NAME!r} has no reward of its own: task.reward_funcs score its completions")
