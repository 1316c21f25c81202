"""Arithmetic word problems with answers in GSM8K's format: working, then `#### 42`.

Synthetic problems are one operation each, in lower case and short, so the tiny char
model can hold them (a real GSM8K file loads through `task.dataset`, its `question`
and `answer` columns mapped to prompt and answer). The answer is the reference
solution, `"3+4=7 #### 7"`: it is also the warm start's demonstration. The reward is 1
when the completion's final answer (workers/rl_tasks/math_answer.py) equals the
reference's, else 0.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from workers.rl_tasks import TaskLengths, TaskSettings
from workers.rl_tasks.math_answer import same_answer

NAMES = ("ann", "bo", "cy", "dee", "eli", "fay")
ITEMS = ("pens", "eggs", "cups", "hats", "keys")
# (template, operator): a, b are the two numbers of the problem, c its answer.
TEMPLATES = (
    ("{name} has {a} {item} and gets {b} more. how many {item} now?", "+"),
    ("{name} has {a} {item} and gives away {b}. how many are left?", "-"),
    ("{name} buys {a} bags of {b} {item}. how many {item}?", "*"),
    ("{a} {item} are shared by {b} kids. how many each?", "/"),
)


class GSM8KOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_number: int = Field(20, ge=2, le=9999, description="The numbers of a problem lie in 1..max_number.")


class GSM8KTask:
    """One-step word problems over 1..max_number, answered `"a op b = c #### c"`."""

    Options = GSM8KOptions
    noise_chars = "0123456789+-*/= #"
    extra_chars = "#"  # beyond the tiny tokenizer's base characters (workers.tokenizer)

    def __init__(self, cfg: TaskSettings) -> None:
        self.options = GSM8KOptions.model_validate(cfg.options)

    @classmethod
    def lengths(cls, cfg: TaskSettings) -> TaskLengths:
        big = GSM8KOptions.model_validate(cfg.options).max_number
        longest = {"name": max(NAMES, key=len), "item": max(ITEMS, key=len), "a": big * big, "b": big}
        prompt = max(len(t.format(**longest)) for t, _ in TEMPLATES)
        answer = len(_solution(big * big, "*", big, big * big))  # the widest numbers
        return TaskLengths(prompt=prompt, answer=answer, answer_source="the longest gsm8k answer (task.options)")

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        top = self.options.max_number
        out = []
        for _ in range(n):
            template, op = rng.choice(TEMPLATES)
            a, b = rng.randint(1, top), rng.randint(1, top)
            if op == "-" and a < b:
                a, b = b, a
            if op == "/":
                a = a * b  # shared equally: a whole number each
            c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            prompt = template.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
            out.append((prompt, _solution(a, op, b, c)))
        return out

    def problem_key(self, prompt: str, answer: str) -> str:
        """The arithmetic (the reference solution, `"3+4=7 #### 7"`): the same sum with
        other names, items or wording is the same problem for the held-out share
        (workers/evaluation.py)."""
        return answer

    def reward(self, completion_text: str, answer: str) -> float:
        return 1.0 if same_answer(completion_text, answer) else 0.0

    def demonstration(self, prompt: str, answer: str) -> str:
        """The reference solution is the completion to learn."""
        return answer


def _solution(a: int, op: str, b: int, c: int) -> str:
    return f"{a}{op}{b}={c} #### {c}"
