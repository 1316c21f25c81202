"""Arithmetic word problems with answers in GSM8K's format: working, then `#### 42`.

Synthetic problems are short and in lower case, so the tiny char model can hold them
(a real GSM8K file loads through `task.dataset`, its `question` and `answer` columns
mapped to prompt and answer). A problem is `steps` operations long: the first is one
of the templated sentences below, each later one acts on the running total
(`"... then 2 are lost. how many now?"`), as GSM8K's problems chain a few facts. The
answer is the reference solution, one equation per step, `"3+4=7 7-2=5 #### 5"`: it is
also the warm start's demonstration. The reward is 1 when the completion's final
answer (workers/rl_tasks/math_answer.py) equals the reference's, else 0.

Why several steps: the held-out share is keyed by the whole chain (`problem_key`), so
a held-out problem of two steps is a new composition of facts that training shows in
other chains, where a held-out problem of one step is a fact training never shows.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from workers.rl_tasks import TaskLengths, TaskSettings
from workers.rl_tasks.math_answer import same_answer

NAMES = ("ann", "bo", "cy", "dee", "eli", "fay")
ITEMS = ("pens", "eggs", "cups", "hats", "keys")
# (statement, question, operator): a, b are the two numbers of the first step.
TEMPLATES = (
    ("{name} has {a} {item} and gets {b} more.", "how many {item} now?", "+"),
    ("{name} has {a} {item} and gives away {b}.", "how many are left?", "-"),
    ("{name} buys {a} bags of {b} {item}.", "how many {item}?", "*"),
    ("{a} {item} are shared by {b} kids.", "how many each?", "/"),
)
# A later step acts on the running total with a new number b.
THEN = {
    "+": "then {b} more come.",
    "-": "then {b} are lost.",
    "*": "then that grows {b} times.",
    "/": "then it is split {b} ways.",
}
THEN_QUESTION = "how many now?"


class GSM8KOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_number: int = Field(20, ge=2, le=9999, description="The numbers of a problem lie in 1..max_number.")
    steps: int = Field(
        1,
        ge=1,
        le=4,
        description="Operations per problem: each step after the first acts on the running total "
        "(a running total stays within 0..max_number², a division is exact).",
    )


class GSM8KTask:
    """Word problems of `steps` operations over 1..max_number, answered one equation a
    step, `"a op b = c ... #### c"`."""

    Options = GSM8KOptions
    noise_chars = "0123456789+-*/= #"
    extra_chars = "#"  # beyond the tiny tokenizer's base characters (workers.model.tokenizer)

    def __init__(self, cfg: TaskSettings) -> None:
        self.options = GSM8KOptions.model_validate(cfg.options)

    @classmethod
    def lengths(cls, cfg: TaskSettings) -> TaskLengths:
        options = GSM8KOptions.model_validate(cfg.options)
        big, steps = options.max_number, options.steps
        longest = {"name": max(NAMES, key=len), "item": max(ITEMS, key=len), "a": big * big, "b": big}
        if steps == 1:
            prompt = max(len(f"{s} {q}".format(**longest)) for s, q, _ in TEMPLATES)
        else:
            first = max(len(s.format(**longest)) for s, _, _ in TEMPLATES)
            then = max(len(t.format(b=big)) for t in THEN.values())
            prompt = first + (steps - 1) * (1 + then) + 1 + len(THEN_QUESTION)
        # The widest equation has a total of max_number² on both sides of it.
        wide = len(f"{big * big}*{big}={big * big}")
        answer = steps * (wide + 1) + len(f"#### {big * big}")
        return TaskLengths(prompt=prompt, answer=answer, answer_source="the longest gsm8k answer (task.options)")

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        return [self._one(rng) for _ in range(n)]

    def _one(self, rng: random.Random) -> tuple[str, str]:
        top, steps = self.options.max_number, self.options.steps
        statement, question, op = rng.choice(TEMPLATES)
        a, b = rng.randint(1, top), rng.randint(1, top)
        if op == "-" and a < b:
            a, b = b, a
        if op == "/":
            a = a * b  # shared equally: a whole number each
        total = _apply(a, op, b)
        name = rng.choice(NAMES)  # drawn before the item: one-step problems as they always were
        item = rng.choice(ITEMS)
        words = [statement.format(name=name, item=item, a=a, b=b)]
        work = [_equation(a, op, b, total)]
        for _ in range(steps - 1):
            op, b = _next_step(total, top, rng)
            after = _apply(total, op, b)
            words.append(THEN[op].format(b=b))
            work.append(_equation(total, op, b, after))
            total = after
        words.append(question.format(item=item) if steps == 1 else THEN_QUESTION)
        return " ".join(words), f"{' '.join(work)} #### {total}"

    def problem_key(self, prompt: str, answer: str) -> str:
        """The arithmetic (the reference solution, `"3+4=7 #### 7"`): the same sums with
        other names, items or wording are the same problem for the held-out share
        (workers/rollout/evaluation.py)."""
        return answer

    def reward(self, completion_text: str, answer: str) -> float:
        return 1.0 if same_answer(completion_text, answer) else 0.0

    def demonstration(self, prompt: str, answer: str) -> str:
        """The reference solution is the completion to learn."""
        return answer


def _next_step(total: int, top: int, rng: random.Random) -> tuple[str, int]:
    """A later step's operator and number: one that keeps the total whole and within
    0..top² (the first step's own range), drawn evenly among those that can."""
    while True:
        op, b = rng.choice("+-*/"), rng.randint(1, top)
        if op == "/" and (b == 1 or total % b):
            continue  # an exact split into two parts or more
        if 0 <= _apply(total, op, b) <= top * top:
            return op, b


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def _equation(a: int, op: str, b: int, c: int) -> str:
    return f"{a}{op}{b}={c}"
