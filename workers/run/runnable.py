"""Whether a valid config names a run that can be built: its task, the task's options,
its reward functions, and what the task asks of the rest of the config (the room its
answers need, demonstrations for a warm start, single completions or episodes).

`RunConfig` (workers/config/run_config.py) checks values only and imports no task: a
config is read in processes that never run one (the site's pages, the simulator, the
reference page), and resolving a task imports the user's code. Here the task registry
(workers/rl_tasks) resolves each name, where a config enters a run: the site's check
at launch, save, retry, rerun and resume (platform/configs/policy.py `config_errors`),
`lifecycle.launch`, and the run's driver.

The refusals are pydantic ValidationErrors of RunConfig, located at the field they are
about, so whoever shows a config's errors shows these the same way.
"""

from __future__ import annotations

from pydantic import ValidationError

from workers.config.run_config import RunConfig
from workers.rl_tasks import task_class, task_lengths, task_options
from workers.rl_tasks.reward_funcs import resolve

Problem = tuple[tuple[str, ...], str]  # (location in the config, message)


def check_runnable(cfg: RunConfig) -> RunConfig:
    """`cfg` when its task, options and reward functions resolve and fit the rest of the
    config; a pydantic ValidationError naming each field to change otherwise."""
    problems = task_problems(cfg)
    if problems:
        # Each detail is pydantic-core's InitErrorDetails, written as the dict it is.
        raise ValidationError.from_exception_data(
            RunConfig.__name__,
            [
                {"type": "value_error", "loc": loc, "input": None, "ctx": {"error": ValueError(message)}}
                for loc, message in problems
            ],
        )
    return cfg


def task_problems(cfg: RunConfig) -> list[Problem]:
    """Every reason `cfg`'s task cannot run as configured, in the order a person would fix
    them: the name first (nothing else about the task can be asked without its class)."""
    try:
        cls = task_class(cfg.task.name)
    except ValueError as exc:  # UnknownTask names the choices
        return [(("task", "name"), str(exc))]
    problems: list[Problem] = []
    if cfg.task.reward_funcs:
        try:
            resolve(cfg.task.reward_funcs, None)
        except ValueError as exc:  # RewardFuncError names the function and the fix
            problems.append((("task", "reward_funcs"), str(exc)))
    try:
        task_options(cls, cfg.task.options)
    except ValueError as exc:
        problems.append((("task",), str(exc)))
    if problems:
        return problems
    if getattr(cls, "dataset_only", False):
        missing: list[Problem] = [
            (("task", field), f"task {cfg.task.name!r} {why}")
            for field, why, absent in (
                ("dataset", "reads its prompts from task.dataset: set it", cfg.task.dataset is None),
                ("reward_funcs", "is scored by task.reward_funcs: name at least one", not cfg.task.reward_funcs),
            )
            if absent
        ]
        if missing:
            return missing
    for check in (_lengths_fit, _warm_start_has_demonstrations, _pipelined_rewards_fit_task, _episodes_fit_task):
        message = check(cfg, cls)
        if message:
            return [((), message)]
    return []


def _lengths_fit(cfg: RunConfig, cls: type) -> str | None:
    # The longest answer plus its EOS must fit in the completion, and BOS + the longest
    # prompt + the completion in the model's positions. A task over a dataset is checked
    # row by row when its file is read (workers/rollout/task_data.py).
    lengths = None if cfg.task.dataset is not None else task_lengths(cfg.task)
    if lengths is None:
        return None
    need = lengths.answer + 1
    if cfg.inference.max_new_tokens < need:
        return (
            f"inference.max_new_tokens ({cfg.inference.max_new_tokens}) must be ≥ "
            f"{lengths.answer_source} + 1 ({need}) so the longest answer and its EOS fit"
        )
    longest = 1 + lengths.prompt + cfg.inference.max_new_tokens
    if cfg.model.source == "tiny" and cfg.model.max_position_embeddings < longest:
        return (
            f"model.max_position_embeddings ({cfg.model.max_position_embeddings}) must "
            f"be ≥ {longest} (BOS + the longest prompt ({lengths.prompt}) + inference.max_new_tokens)"
        )
    return None


def _warm_start_has_demonstrations(cfg: RunConfig, cls: type) -> str | None:
    if (cfg.warm_start.steps or cfg.warm_start.noisy_steps) and not hasattr(cls, "demonstration"):
        return (
            f"task {cfg.task.name!r} offers no demonstration (a demonstration(prompt, answer) method), so "
            "there is nothing to warm-start on: set warm_start.steps and warm_start.noisy_steps to 0"
        )
    return None


def _pipelined_rewards_fit_task(cfg: RunConfig, cls: type) -> str | None:
    if cfg.rewards.mode == "pipelined" and getattr(cls, "multi_turn", False):
        return (
            f"rewards.mode 'pipelined' streams single completions, but task {cfg.task.name!r} runs multi-turn "
            "episodes: set rewards.mode to 'after'"
        )
    return None


def _episodes_fit_task(cfg: RunConfig, cls: type) -> str | None:
    multi_agent = bool(getattr(cls, "multi_agent", False))
    if cfg.buffer.unit == "episode" and not (multi_agent or getattr(cls, "multi_turn", False)):
        return (
            f"buffer.unit 'episode' schedules episodes, and task {cfg.task.name!r} has none (it is neither "
            "multi-agent nor multi-turn): set buffer.unit to 'group', or task.name to such a task "
            "(propose_solve, calculator)"
        )
    if multi_agent:
        refused = {
            "rewards.mode 'pipelined'": cfg.rewards.mode == "pipelined",
            "rewards.credit 'process'": cfg.rewards.credit == "process",
            "a reward pool (rewards.workers)": cfg.rewards.workers > 0,
            "task.reward_funcs": bool(cfg.task.reward_funcs),
        }
        asked = [name for name, on in refused.items() if on]
        if asked:
            return (
                f"task {cfg.task.name!r} is multi-agent: each agent's reward is the task's own, scored as its "
                f"episode ends; {', '.join(asked)} cannot apply to it. Leave rewards at their defaults and "
                "task.reward_funcs empty"
            )
    return None
