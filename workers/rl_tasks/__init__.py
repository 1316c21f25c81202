"""Tasks with verifiable rewards, chosen by `task.name` in one place: `task_class`.

`task.name` is one of three things:

- a built-in name (`BUILTINS`): Rollway's own tasks, registered by dotted path and
  imported only when a run names them;
- an importable dotted path, `"package.module:ClassName"`: a task in the user's own
  package, with nothing registered anywhere, once the operator has listed its module
  in `ROLLWAY_TASK_MODULES` (workers/core/task_modules.py: exact module names, or
  `package.*`; comma-separated). A config is hostile
  input and importing a module runs its code, so by default no dotted path is taken;
- the name of a Python entry point in the group `rollway.tasks` (`ENTRY_POINT_GROUP`):
  a package that declares, in its pyproject.toml,
  `[project.entry-points."rollway.tasks"] my_task = "my_pkg.tasks:MyTask"`.

A task class is built with the run's `TaskConfig` and offers:

- `sample(n, rng)`: `n` synthetic (prompt, answer) pairs;
- `reward(completion_text, answer)`: a score in [0, 1];
- `demonstration(prompt, answer)`: the completion a supervised warm start teaches for a
  pair (optional: without it the warm start must be off);
- `Options` (optional): a pydantic model for the task's own settings, `task.options`;
- `lengths(task_cfg)` (optional classmethod): the longest prompt and answer it samples,
  so a config whose model cannot hold them is refused before it runs;
- `problem_key(prompt, answer)` (optional): what makes two pairs the same problem (the
  prompt where absent), so the share of problems held out for evaluation holds every
  wording of a problem or none (workers/rollout/evaluation.py).

The tasks tier may import the core tier only: a user's task module imports it, and the
config that names a task stands above it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from workers.core.task_modules import import_user_module, refusal
from workers.rl_tasks.reward_funcs import RewardFuncTask, resolve

ENTRY_POINT_GROUP = "rollway.tasks"

# Dotted paths, imported lazily: a run pays only for the task it names. `calculator`
# lives in its own module, written beside this registry.
BUILTINS: dict[str, str] = {
    "reverse": "workers.rl_tasks.reverse:ReverseTask",
    "copy": "workers.rl_tasks.reverse:CopyTask",
    "countdown": "workers.rl_tasks.countdown:CountdownTask",
    "gsm8k": "workers.rl_tasks.gsm8k:GSM8KTask",
    "calculator": "workers.rl_tasks.tool_task:CalculatorTask",
    "propose_solve": "workers.rl_tasks.propose_solve:ProposeSolveTask",
    "dataset": "workers.rl_tasks.dataset_task:DatasetTask",
}

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class TaskSettings(Protocol):
    """What a task is built with: the run's `task` section, workers.config.run_config.TaskConfig
    (not imported here: the config stands on a tier above the tasks). `reverse` reads its own top-level fields; every
    other task reads `options`."""

    @property
    def name(self) -> str: ...
    @property
    def options(self) -> dict: ...
    @property
    def min_len(self) -> int: ...
    @property
    def max_len(self) -> int: ...
    @property
    def alphabet(self) -> str: ...
    @property
    def reward(self) -> str: ...


class Task(Protocol):
    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """`n` (prompt text, answer) pairs."""
        ...

    def reward(self, completion_text: str, answer: str) -> float:
        """Score in [0, 1] of a decoded completion (EOS and after already stripped)."""
        ...


@dataclass(frozen=True)
class TaskLengths:
    """The longest prompt and answer (characters) a task samples; `answer_source` names
    what sets the answer's length, for the config error that asks for more room."""

    prompt: int
    answer: int
    answer_source: str


class UnknownTask(ValueError):
    """`task.name` names no task that can be loaded; the message says why and what is."""


def _hint() -> str:
    return (
        f"built-in tasks: {', '.join(BUILTINS)}; or a 'package.module:ClassName' path; "
        f"or the name of an entry point in the {ENTRY_POINT_GROUP!r} group"
    )


def _load(path: str, name: str) -> type:
    if not _DOTTED.match(path):
        raise UnknownTask(f"task.name {name!r} is not a valid 'package.module:ClassName' path ({_hint()})")
    module_name, _, attr = path.partition(":")
    builtin = (
        f"task.name {name!r} is a built-in task whose module {module_name!r} this Rollway cannot import "
        f"({{exc}}); choose another task ({_hint()})"
    )
    obj: Any = import_user_module(
        module_name, f"task.name {name!r}", UnknownTask, missing=builtin if name in BUILTINS else None
    )
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UnknownTask(f"task.name {name!r}: module {module_name!r} has no {attr!r}")
    if not isinstance(obj, type) or not all(callable(getattr(obj, m, None)) for m in ("sample", "reward")):
        raise UnknownTask(f"task.name {name!r}: {path!r} is not a task class (a class with sample() and reward())")
    return obj


def _check_allowed(name: str) -> None:
    problem = refusal(name.partition(":")[0], "task modules")
    if problem:
        raise UnknownTask(
            f"task.name {name!r}: {problem}, or registers the task as a {ENTRY_POINT_GROUP!r} entry point"
        )


def task_class(name: str) -> type:
    """The task class `task.name` names (built-in first, then a dotted path, then an
    entry point); UnknownTask with the reason and the choices otherwise."""
    if name in BUILTINS:
        return _load(BUILTINS[name], name)
    if ":" in name:
        if _DOTTED.match(name):
            _check_allowed(name)  # before anything is imported
        return _load(name, name)
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if found:
        ep = next(iter(found))
        return _load(ep.value, name)
    raise UnknownTask(f"unknown task.name {name!r}; {_hint()}")


def task_options(cls: type, options: dict) -> BaseModel | None:
    """`task.options` validated by the task's own `Options` model; ValueError naming
    the field under `task.options` otherwise."""
    model = getattr(cls, "Options", None)
    if model is None:
        if options:
            raise ValueError(f"task.options: task {cls.__name__} takes no options (got {sorted(options)})")
        return None
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"task.options.{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ValueError("; ".join(parts)) from None


def task_lengths(task_cfg: TaskSettings) -> TaskLengths | None:
    """The longest prompt and answer the task samples, when it says (None: unknown until
    its data is read, or a task that does not say)."""
    lengths = getattr(task_class(task_cfg.name), "lengths", None)
    return lengths(task_cfg) if lengths is not None else None


def make_task(task_cfg: TaskSettings) -> Task:
    """The task named by `task.name`, built with its config; with `task.reward_funcs`
    set, scored by those functions instead of its own reward (workers/rl_tasks/reward_funcs.py)."""
    task = task_class(task_cfg.name)(task_cfg)
    paths = getattr(task_cfg, "reward_funcs", None)
    if not paths:
        return task

    dataset = getattr(task_cfg, "dataset", None)
    funcs = resolve(paths, getattr(task_cfg, "reward_weights", None))
    return RewardFuncTask(task, funcs, dataset is not None, dataset.answer_column if dataset is not None else None)
