"""Synthetic tasks with verifiable rewards, small enough for a tiny model to learn on CPU.

`reverse`: the prompt is a random string followed by "=", the answer is the string
reversed ("abc=" → "cba", then EOS). `copy`: the same prompts, the string itself as the
answer. The default reward is prefix partial credit (the
correct prefix over the longer of completion and answer): denser than exact match, whose
groups are often all zeros for a weak policy (no advantage to learn from), and cleaner
credit than per-position matching, where a sequence wrong early still earns for later
positions, so GRPO cannot tell which token earned the reward.
"""

from __future__ import annotations

import random

from workers.rl_tasks import TaskLengths, TaskSettings


class ReverseTask:
    """Reverse a string of `min_len`..`max_len` characters drawn from `alphabet` (the
    top-level fields of `task`, which predate `task.options`)."""

    def __init__(self, cfg: TaskSettings) -> None:
        self.cfg = cfg
        # What the warm start's noisy phase replaces characters with.
        self.noise_chars = cfg.alphabet

    @classmethod
    def lengths(cls, cfg: TaskSettings) -> TaskLengths:
        return TaskLengths(prompt=cfg.max_len + 1, answer=cfg.max_len, answer_source="task.max_len")

    def demonstration(self, prompt: str, answer: str) -> str:
        """The answer is the completion."""
        return answer

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        out = []
        for _ in range(n):
            length = rng.randint(self.cfg.min_len, self.cfg.max_len)
            text = "".join(rng.choice(self.cfg.alphabet) for _ in range(length))
            out.append((text + "=", text[::-1]))
        return out

    def reward(self, completion_text: str, answer: str) -> float:
        """Partial credit over the longer of completion and answer, so a completion that
        is too long or too short loses the positions it gets wrong (the policy learns to
        stop at the right length as well).

        `reward="prefix"`: only the correct prefix counts; `"position"`: every position
        that matches counts.
        """
        denom = max(len(completion_text), len(answer))
        if denom == 0:
            return 1.0
        if self.cfg.reward == "exact":
            return 1.0 if completion_text == answer else 0.0
        if self.cfg.reward == "prefix":
            # Characters up to the first mismatch (the shorter string's length if none).
            hits = next(
                (i for i, (a, b) in enumerate(zip(completion_text, answer, strict=False)) if a != b),
                min(len(completion_text), len(answer)),
            )
        else:
            hits = sum(a == b for a, b in zip(completion_text, answer, strict=False))
        return hits / denom


class CopyTask(ReverseTask):
    """Repeat the string ("abc=" → "abc"), scored as `reverse` is. Each answer token sits
    a fixed distance after the one it copies, which a tiny model learns in a few hundred
    steps even for long strings; reversing 64 characters it had not learned after 300.
    For generation-heavy benches (bench/peer_trl.py)."""

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        return [(prompt, prompt[:-1]) for prompt, _ in super().sample(n, rng)]
