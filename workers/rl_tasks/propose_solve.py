"""Propose and solve: a two-role task, one episode = a proposer's turn, then a solver's.

The proposer is given numbers, ``"pose 3 5:"``, and poses a problem over them: an
arithmetic expression using each given number exactly once, ``"3*5"``. The solver is
given that problem, ``"3*5="``, and answers it, ``"15"``. One policy plays both roles (it
is told which by its prompt); each role has its reward:

- proposer: 1 for a well-formed problem over exactly the given numbers whose value is a
  whole number ≥ 0 (something the solver can answer), else 0;
- solver: 1 when its answer equals the problem's value, else 0 (0 when the problem was
  not well formed: there is nothing to solve).

Each role's environment answers after the role's turn with a wait drawn from a
heavy-tailed distribution the options set (workers/core/latency.py): the proposer's problem is
checked, the solver's answer graded, each by a service whose time has a long tail. That
is the workload where an episode's stragglers decide a step's time (`buffer.unit`).

The episode loop is workers/rollout/episode_scheduler.py; a task says it has several agents with
`multi_agent = True` and offers `agents`, `agent_prompt`, `agent_rewards` and `latency`.
Evaluation (and `reward`) scores the first role's turn alone: the proposer's validity on
held-out number sets.
"""

from __future__ import annotations

import random
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from workers.core.latency import Latency
from workers.rl_tasks import TaskLengths, TaskSettings
from workers.rl_tasks.countdown import evaluate

PROMPT_PREFIX = "pose "
PROMPT_END = ":"
PROBLEM_END = "="


class ProposeSolveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    count: int = Field(2, ge=2, le=4, description="Numbers the proposer is given.")
    max_number: int = Field(9, ge=1, le=99, description="Numbers are drawn from 1..max_number.")
    proposer_median_s: float = Field(0.0, ge=0, le=600, description="Median wait of the proposer's environment (s).")
    proposer_p90_ratio: float = Field(1.0, ge=1, le=1000, description="Its 90th percentile over its median.")
    solver_median_s: float = Field(0.0, ge=0, le=600, description="Median wait of the solver's environment (s).")
    solver_p90_ratio: float = Field(1.0, ge=1, le=1000, description="Its 90th percentile over its median.")


def numbers_of(answer: str) -> list[int]:
    """The given numbers of a pair's answer ("3 5")."""
    return [int(n) for n in answer.split()]


def problem_value(problem: str, numbers: list[int]) -> int | None:
    """The value of a proposed problem if it is well formed, uses each of `numbers`
    exactly once, and is a whole number ≥ 0; else None."""
    value = evaluate(problem, numbers)
    if value is None or value.denominator != 1 or value < 0:
        return None
    if sorted(int(t) for t in _literals(problem)) != sorted(numbers):
        return None  # evaluate allows a subset; a problem must use them all
    return int(value)


def _literals(problem: str) -> list[str]:
    out, digits = [], ""
    for c in problem:
        if c.isdigit():
            digits += c
        elif digits:
            out.append(digits)
            digits = ""
    return [*out, digits] if digits else out


class ProposeSolveTask:
    multi_agent = True
    agents: tuple[str, ...] = ("proposer", "solver")
    Options = ProposeSolveOptions

    def __init__(self, cfg: TaskSettings | None = None) -> None:
        o = ProposeSolveOptions.model_validate(cfg.options if cfg is not None else {})
        self.count = o.count
        self.max_number = o.max_number
        self._latency = {
            "proposer": Latency(o.proposer_median_s, o.proposer_p90_ratio),
            "solver": Latency(o.solver_median_s, o.solver_p90_ratio),
        }

    @classmethod
    def lengths(cls, cfg) -> TaskLengths:
        """The longest prompt either role sees, and the longest completion either writes
        (the proposer's problem: every number and an operator between two)."""
        o = ProposeSolveOptions.model_validate(cfg.options)
        width = len(str(o.max_number))
        problem = o.count * width + (o.count - 1)
        return TaskLengths(
            prompt=max(len(PROMPT_PREFIX) + o.count * (width + 1), problem + len(PROBLEM_END)),
            answer=max(problem, len(str(o.max_number**o.count))),
            answer_source="the proposer's longest problem (task.options count and max_number)",
        )

    # -- the Task protocol ------------------------------------------------------------

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """`n` (proposer prompt, given numbers) pairs: ("pose 3 5:", "3 5")."""
        out = []
        for _ in range(n):
            numbers = " ".join(str(rng.randint(1, self.max_number)) for _ in range(self.count))
            out.append((f"{PROMPT_PREFIX}{numbers}{PROMPT_END}", numbers))
        return out

    def reward(self, completion_text: str, answer: str) -> float:
        """The first role's reward alone (what evaluation scores): a valid problem."""
        return 1.0 if problem_value(completion_text.strip(), numbers_of(answer)) is not None else 0.0

    def demonstration(self, prompt: str, answer: str) -> str:
        """A valid problem over the numbers (for a supervised warm start of the proposer)."""
        numbers = numbers_of(answer)
        rng = random.Random(prompt)
        ops = [rng.choice("+*") for _ in numbers[1:]]
        return str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:], strict=True))

    def role_demonstrations(self, prompt: str, answer: str) -> list[tuple[str, str]]:
        """(prompt, completion) for each role of one episode (the warm start teaches both)."""
        problem = self.demonstration(prompt, answer)
        return [(prompt, problem), (problem + PROBLEM_END, str(problem_value(problem, numbers_of(answer))))]

    # -- the agents (workers/rollout/episode_scheduler.py) --------------------------------------

    def agent_prompt(self, agent: str, prompt: str, texts: dict[str, str]) -> str:
        """What `agent` is given, after the earlier roles wrote `texts`."""
        if agent == "proposer":
            return prompt
        return texts["proposer"].strip() + PROBLEM_END

    def agent_rewards(self, prompt: str, answer: str, texts: dict[str, str]) -> dict[str, float]:
        """Each role's reward for one finished episode."""
        value = problem_value(texts["proposer"].strip(), numbers_of(answer))
        solved = value is not None and _number(texts["solver"]) == value
        return {"proposer": float(value is not None), "solver": float(solved)}

    def latency(self, agent: str) -> Latency:
        """How long `agent`'s environment takes to answer its turn."""
        return self._latency[agent]


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None
