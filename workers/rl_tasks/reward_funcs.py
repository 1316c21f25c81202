"""Rewards written as TRL's GRPOTrainer takes them: `task.reward_funcs`.

A reward function is any importable callable

    def my_reward(prompts, completions, **columns) -> list[float | None]

called once per group with the group's prompts and completions (one entry per
completion; the prompt repeated) and, by name, every column of the dataset row but
the prompt (a task without a dataset passes its one column, `answer`). As in TRL,
`completions` are plain strings for a text dataset, and for a conversational one
(prompts as lists of {"role", "content"} messages) each completion is a list holding
one assistant message. `completion_ids` (each completion's token ids) is passed too.
A function whose signature has no `**kwargs` is passed only the arguments it names.

The reward of a completion is the weighted sum over the functions (`task.reward_weights`,
1 each by default). A function may answer None for a completion it does not apply to;
as in TRL, that value counts as NaN: left out of the sum and out of that function's
`rewards/<name>/mean` and `/std` series.

With `task.reward_funcs` set, the task named by `task.name` still supplies the prompts
(its generator, or the rows of `task.dataset`), its demonstrations and its tool
environment; its own `reward` is not used. A dataset row's columns travel with it as
its answer, a JSON object (`row_answer`, `row_columns`).

Importing a module runs its code, so the functions' modules must be listed in
`ROLLWAY_TASK_MODULES`, exactly as a dotted `task.name`'s.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.core import chat
from workers.core.metric_names import reward_func_series, reward_func_series_name
from workers.core.task_modules import import_user_module, refusal

FIELD = "task.reward_funcs"
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# Arguments Rollway passes besides the row's columns; no column may take these names.
PASSED = ("prompts", "completions", "completion_ids")


class RewardFuncError(ValueError):
    """A reward function that cannot serve the run; the message names the field."""


def _load(path: str) -> Callable:
    if not _PATH.match(path):
        raise RewardFuncError(f"{FIELD}: {path!r} is not a 'package.module:function' path")
    module_name, _, attr = path.partition(":")
    problem = refusal(module_name, "reward-function modules")
    if problem:
        raise RewardFuncError(f"{FIELD}: {path!r}: {problem}")
    module = import_user_module(module_name, f"{FIELD}: {path!r}", RewardFuncError)
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise RewardFuncError(f"{FIELD}: {path!r}: module {module_name!r} has no function {attr!r}")
    return func


@dataclass(frozen=True)
class RewardFunc:
    path: str
    name: str  # the function's name, as TRL names its series
    func: Callable
    weight: float
    takes_all: bool  # a **kwargs parameter: every column is passed
    params: frozenset[str]  # the keyword parameters it names

    def needs(self) -> set[str]:
        """Columns it names without a default: a dataset must have each."""
        sig = inspect.signature(self.func)
        return {
            n
            for n, p in sig.parameters.items()
            if n not in PASSED and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def __call__(self, arguments: dict[str, Any]) -> list:
        if self.takes_all:
            return self.func(**arguments)
        return self.func(**{k: v for k, v in arguments.items() if k in self.params})


def _checked(path: str, weight: float) -> RewardFunc:
    func = _load(path)
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        raise RewardFuncError(f"{FIELD}: {path!r} has no signature Python can read") from None
    kinds = {p.kind for p in sig.parameters.values()}
    params = frozenset(n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    takes_all = inspect.Parameter.VAR_KEYWORD in kinds
    if "completions" not in params:
        raise RewardFuncError(
            f"{FIELD}: {path!r} takes no 'completions' argument; write it as TRL's reward functions are, "
            f"reward(prompts, completions, **kwargs) -> list[float] (it is {path.partition(':')[2]}{sig})"
        )
    if any(p.kind == p.POSITIONAL_ONLY for p in sig.parameters.values()):
        raise RewardFuncError(
            f"{FIELD}: {path!r} has positional-only parameters; its arguments are passed by name "
            f"(prompts=, completions=, and the dataset's columns)"
        )
    name = path.partition(":")[2]
    return RewardFunc(path, name, func, float(weight), takes_all, params)


def resolve(paths: Sequence[str], weights: Sequence[float] | None) -> list[RewardFunc]:
    """The functions `task.reward_funcs` names, imported and signature-checked, with
    their weights; RewardFuncError naming the field otherwise."""
    if weights is not None and len(weights) != len(paths):
        raise RewardFuncError(
            f"task.reward_weights has {len(weights)} weights for {len(paths)} task.reward_funcs; give one per "
            "function, in the same order, or leave it unset (1 each)"
        )
    funcs = [_checked(p, w) for p, w in zip(paths, weights if weights is not None else [1.0] * len(paths), strict=True)]
    seen: dict[str, str] = {}
    for f in funcs:
        key = reward_func_series_name(f.name)
        if key in seen:
            raise RewardFuncError(
                f"{FIELD}: {seen[key]!r} and {f.path!r} would report under one series, "
                f"{reward_func_series(f.name, 'mean')!r}: rename one of the functions"
            )
        seen[key] = f.path
    return funcs


def row_answer(columns: dict[str, Any]) -> str:
    """A dataset row's columns (its prompt left out) as the text its answer travels as."""
    return json.dumps(columns, ensure_ascii=False, sort_keys=True, default=str)


def row_columns(answer: str) -> dict[str, Any]:
    """The columns `row_answer` wrote."""
    value = json.loads(answer)
    if not isinstance(value, dict):
        raise ValueError("a reward-function row's answer is a JSON object of its columns")
    return value


@dataclass(frozen=True)
class Scores:
    """A group's rewards: the weighted sums and each function's values (None: not applicable)."""

    totals: list[float]
    parts: list[dict[str, float | None]]


class RewardFuncTask:
    """The run's task with its reward replaced by `task.reward_funcs`: everything else
    (prompts, demonstrations, the tool environment, lengths) is the task's own."""

    def __init__(self, task: Any, funcs: list[RewardFunc], from_dataset: bool, answer_column: str | None) -> None:
        self.task = task
        self.funcs = funcs
        self.from_dataset = from_dataset
        self.answer_column = answer_column

    def __getattr__(self, name: str) -> Any:
        # Only for what this class lacks; never for `task` itself (not yet set while
        # an instance is being unpickled) or Python's own protocol names.
        if name == "task" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.task, name)

    def columns(self, answer: str) -> dict[str, Any]:
        """The row's columns that `answer` carries."""
        return row_columns(answer) if self.from_dataset else {"answer": answer}

    def demonstration(self, prompt: str, answer: str) -> str:
        """The task's demonstration for the row's answer column."""
        columns = self.columns(answer)
        column = self.answer_column or "answer"
        if column not in columns:
            raise ValueError(
                f"the warm start's demonstrations need the row's answer, but it has no column {column!r}: "
                "set task.dataset.answer_column, or warm_start.steps and warm_start.noisy_steps to 0"
            )
        return self.task.demonstration(prompt, str(columns[column]))

    def score(self, prompt: str, answer: str, texts: list[str], completion_ids: list[list[int]]) -> Scores:
        """Every function on the group's completions; RewardFuncError (with the function's
        path) for a function that raises or answers something other than one number or
        None per completion."""
        messages = chat.messages_of(prompt)
        n = len(texts)
        arguments: dict[str, Any] = {
            **{k: [v] * n for k, v in self.columns(answer).items() if k not in PASSED},
            "prompts": [messages if messages is not None else prompt] * n,
            "completions": [[{"role": "assistant", "content": t}] for t in texts] if messages is not None else texts,
            "completion_ids": completion_ids,
        }
        parts: list[dict[str, float | None]] = [{} for _ in texts]
        totals = [0.0] * n
        for f in self.funcs:
            try:
                values = list(f(arguments))
            except Exception as exc:
                raise RewardFuncError(f"{FIELD}: {f.path!r} raised {type(exc).__name__}: {exc}") from exc
            if len(values) != n:
                raise RewardFuncError(f"{FIELD}: {f.path!r} returned {len(values)} rewards for {n} completions")
            for k, v in enumerate(values):
                if v is None or (isinstance(v, numbers.Real) and math.isnan(v)):  # TRL's NaN: not applicable
                    parts[k][f.name] = None
                    continue
                if not isinstance(v, numbers.Real) or not math.isfinite(v):  # numpy's floats are Real too
                    raise RewardFuncError(f"{FIELD}: {f.path!r} returned {v!r}; a reward is a finite number or None")
                parts[k][f.name] = float(v)
                totals[k] += f.weight * float(v)
        return Scores(totals, parts)

    def reward(self, completion_text: str, answer: str) -> float:
        """One completion's weighted reward, its prompt unknown (passed as "")."""
        return self.score("", answer, [completion_text], [[]]).totals[0]


def score_group(task: Any, prompt: str, answer: str, texts: list[str], completion_ids: list[list[int]]) -> Scores:
    """A group's rewards under the run's task: its reward functions where it has them
    (with each one's values), else the task's own reward per completion (no parts)."""
    if isinstance(task, RewardFuncTask):
        return task.score(prompt, answer, texts, completion_ids)
    return Scores([float(task.reward(t, answer)) for t in texts], [{} for _ in texts])
