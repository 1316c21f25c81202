"""The arithmetic example: questions such as "7+5=" or "3-8=" answered by a number.

`ArithmeticTask` supplies what a run needs besides the reward: questions drawn by its
generator (the same ones `make_data` writes), the demonstration a warm start teaches, and
the longest prompt and answer. The reward comes from the two functions below, written as
TRL's GRPOTrainer takes them; `run.yaml` names them in `task.reward_funcs`.

Every character is one the tiny model's tokenizer has (digits, "+", "-", "="). One-digit
operands keep it within what the tiny model learns in a minute; `question` takes "*" too.
"""

from __future__ import annotations

import random

from workers.rl_tasks import TaskLengths

OPERATORS = "+-"  # add "*" for a harder task
MAX_OPERAND = 9


def question(rng: random.Random) -> dict[str, str]:
    """One dataset row: the prompt, its answer, and the operator (a column of its own)."""
    a, b, op = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND), rng.choice(OPERATORS)
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return {"prompt": f"{a}{op}{b}=", "answer": str(value), "op": op}


# -- reward functions: reward(prompts, completions, **columns) -> list[float | None] --------


def correct_answer(prompts, completions, answer, **kwargs):
    """1.0 for a completion that is exactly the answer, else 0.0."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def sign_first(prompts, completions, answer, op, **kwargs):
    """For subtractions only (None elsewhere: not applicable): 1.0 when the completion's
    sign matches the answer's, the step a model gets wrong first."""
    return [
        None if o != "-" else float(c.strip().startswith("-") == a.startswith("-"))
        for c, a, o in zip(completions, answer, op, strict=True)
    ]


class ArithmeticTask:
    """Questions `a<op>b=` with a, b in 0..MAX_OPERAND; the answer is the value."""

    def __init__(self, cfg=None) -> None:
        self.cfg = cfg

    @classmethod
    def lengths(cls, cfg) -> TaskLengths:
        extremes = {"+": 2 * MAX_OPERAND, "-": -MAX_OPERAND, "*": MAX_OPERAND * MAX_OPERAND}
        answer = max(len(str(extremes[op])) for op in OPERATORS)
        return TaskLengths(prompt=2 * len(str(MAX_OPERAND)) + 2, answer=answer, answer_source="the longest value")

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        return [(q["prompt"], q["answer"]) for q in (question(rng) for _ in range(n))]

    def reward(self, completion_text: str, answer: str) -> float:
        return correct_answer([""], [completion_text], [answer])[0]

    def demonstration(self, prompt: str, answer: str) -> str:
        return answer
