"""Countdown: reach a target from given numbers with + - * / and parentheses.

The prompt lists the numbers and the target, `"3 5 7:22="`; the answer is the problem
itself, `"3 5 7:22"` (what the reward needs to check any solution, since many exist);
a completion is an expression such as `"3*5+7"` that uses each given number at
most once and evaluates to the target.

The verifier parses the completion with `ast` (never `eval`): only integer literals,
the four operators and parentheses are accepted, division is exact (`fractions`), and a
completion longer than `MAX_EXPRESSION_CHARS` is refused before parsing, so a hostile or
degenerate completion costs nothing (Python's `**` is not an operator here at all, so no
huge power can be asked for).

Reward: 1 for a correct expression; `options.partial_credit` (0.1 by default) for a
well-formed expression that uses only the given numbers but misses the target; 0
otherwise. The small credit gives GRPO something to rank in the groups of a weak policy,
whose completions are otherwise all zeros (no advantage to learn from), and it is small
enough that reaching the target always dominates.
"""

from __future__ import annotations

import ast
import functools
import random
from collections import Counter
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from workers.rl_tasks import TaskLengths, TaskSettings

# Far longer than any solution to a problem this task poses (≤ 5 numbers of ≤ 4 digits).
MAX_EXPRESSION_CHARS = 100
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class CountdownOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    count: int = Field(3, ge=2, le=4, description="Numbers per problem (≤ 4: demonstrations are found by search).")
    max_number: int = Field(20, ge=1, le=999, description="Numbers are drawn from 1..max_number.")
    max_target: int = Field(100, ge=2, le=9999, description="Targets lie in 1..max_target.")
    partial_credit: float = Field(
        0.1, ge=0, lt=1, description="Reward of a well-formed expression over the given numbers that misses."
    )


def parse_problem(answer: str) -> tuple[list[int], int]:
    """(numbers, target) of an answer `"3 5 7:22"`; ValueError if it is not one."""
    numbers, sep, target = answer.strip().partition(":")
    if not sep:
        raise ValueError(f"countdown answer {answer!r} is not 'n1 n2 ...:target'")
    return [int(n) for n in numbers.split()], int(target)


def evaluate(expression: str, numbers: list[int]) -> Fraction | None:
    """The exact value of `expression` if it is well formed and uses only `numbers`
    (each at most as often as given); None otherwise (malformed, other numbers, a
    division by zero, or too long)."""
    if len(expression) > MAX_EXPRESSION_CHARS or not expression.strip():
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return left / right  # ZeroDivisionError is caught below
        raise ValueError("not allowed")

    try:
        result = value(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    if Counter(used) - Counter(numbers):  # a number not given, or used too often
        return None
    return result


@functools.lru_cache(maxsize=4096)
def solve(numbers: tuple[int, ...], target: int) -> str | None:
    """An expression over a subset of `numbers` equal to `target` with the fewest
    operations, or None. Searched over positive integer steps only (countdown's usual
    rule, and what `CountdownTask.sample` generates, so its problems are always found):
    a depth-first search that deepens one operation at a time and stops at the first
    hit, deterministic for given numbers. Fractions would make the search far slower
    for solutions a demonstration does not need."""
    start = [(n, str(n), 3) for n in numbers]
    for depth in range(len(numbers)):
        found = _search(start, target, depth)
        if found is not None:
            return found
    return None


def _search(items: list[tuple[int, str, int]], target: int, depth: int) -> str | None:
    """A text among `items` (value, text, precedence) worth `target` after exactly
    `depth` more combinations of two items into one."""
    if depth == 0:
        return next((text for value, text, _ in items if value == target), None)
    for i in range(len(items)):
        for j in range(len(items)):
            if i == j:
                continue
            rest = [x for k, x in enumerate(items) if k not in (i, j)]
            for combined in _combine(*items[i], *items[j]):
                found = _search([*rest, combined], target, depth - 1)
                if found is not None:
                    return found
    return None


def _combine(a: int, ta: str, pa: int, b: int, tb: str, pb: int):
    """a op b as (value, text, precedence) for each operator whose result is a positive
    integer, parenthesised only where precedence needs it (3 = a number, 2 = * /,
    1 = + -)."""

    def wrap(text: str, prec: int, need: int) -> str:
        return f"({text})" if prec < need else text

    yield a + b, f"{ta}+{tb}", 1
    if a > b:
        yield a - b, f"{ta}-{wrap(tb, pb, 2)}", 1
    yield a * b, f"{wrap(ta, pa, 2)}*{wrap(tb, pb, 2)}", 2
    if a % b == 0:
        yield a // b, f"{wrap(ta, pa, 2)}/{wrap(tb, pb, 3)}", 2


class CountdownTask:
    """Countdown problems with a reachable target, their verifier and their solver."""

    Options = CountdownOptions
    noise_chars = "0123456789+-*/()"
    extra_chars = "()"  # beyond the tiny tokenizer's base characters (workers.model.tokenizer)

    def __init__(self, cfg: TaskSettings) -> None:
        self.options = CountdownOptions.model_validate(cfg.options)

    @classmethod
    def lengths(cls, cfg: TaskSettings) -> TaskLengths:
        o = CountdownOptions.model_validate(cfg.options)
        digits = len(str(o.max_number))
        prompt = o.count * digits + (o.count - 1) + 1 + len(str(o.max_target)) + 1
        # Each of the count-1 operations adds its operator and at most one pair of
        # parentheses around itself.
        answer = o.count * digits + 3 * (o.count - 1)
        return TaskLengths(prompt=prompt, answer=answer, answer_source="the longest countdown solution (task.options)")

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """Problems whose target an expression over all the numbers reaches: the
        numbers, then a chain of random operations over them in a random order, each
        step a positive integer (so `solve` finds it), kept when the target lies in
        1..max_target."""
        o = self.options
        out: list[tuple[str, str]] = []
        while len(out) < n:
            numbers = [rng.randint(1, o.max_number) for _ in range(o.count)]
            order = rng.sample(numbers, len(numbers))
            value = order[0]
            for x in order[1:]:
                value = rng.choice([v for v, _, _ in _combine(value, "", 3, x, "", 3)])
            if value <= o.max_target:
                spec = f"{' '.join(map(str, numbers))}:{int(value)}"
                out.append((spec + "=", spec))
        return out

    def problem_key(self, prompt: str, answer: str) -> str:
        """The numbers as a multiset and the target: "3 5:8" and "5 3:8" are one problem,
        so the held-out share (workers/rollout/evaluation.py) holds both or neither."""
        numbers, target = parse_problem(answer)
        return f"{' '.join(map(str, sorted(numbers)))}:{target}"

    def reward(self, completion_text: str, answer: str) -> float:
        numbers, target = parse_problem(answer)
        value = evaluate(completion_text, numbers)
        if value is None:
            return 0.0
        return 1.0 if value == target else self.options.partial_credit

    def demonstration(self, prompt: str, answer: str) -> str:
        """The shortest solution (by search); ValueError for a problem without one."""
        numbers, target = parse_problem(answer)
        solution = solve(tuple(numbers), target)
        if solution is None:
            raise ValueError(f"countdown problem {answer!r} has no solution")
        return solution
