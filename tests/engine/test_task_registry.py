"""The task registry: built-in names, dotted paths, entry points, and the errors."""

from __future__ import annotations

import random
import sys
import types
from importlib.metadata import EntryPoint, EntryPoints

import pydantic
import pytest

import workers.core.task_modules as task_modules
import workers.rl_tasks as registry
from workers.config.run_config import RunConfig, TaskConfig
from workers.rl_tasks import BUILTINS, UnknownTask, make_task, task_class
from workers.rl_tasks.countdown import CountdownTask
from workers.rl_tasks.reverse import ReverseTask
from workers.run.runnable import check_runnable


def runnable(data: dict) -> RunConfig:
    """The config as a launch takes it: its values validated, then its task resolved."""
    return check_runnable(RunConfig.model_validate(data))


class EchoTask:
    """A user's task: the answer is the prompt without its '='."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg

    def sample(self, n, rng):
        return [(f"{c}=", c) for c in rng.choices("abc", k=n)]

    def reward(self, completion_text, answer):
        return float(completion_text == answer)

    def demonstration(self, prompt, answer):
        return answer


class NoDemoTask:
    """A user's task without demonstrations."""

    def __init__(self, cfg: TaskConfig) -> None:
        pass

    def sample(self, n, rng):
        return [("a=", "a")] * n

    def reward(self, completion_text, answer):
        return float(completion_text == answer)


@pytest.fixture
def user_module(monkeypatch):
    """A module `my_tasks` holding the tasks above, importable as a user's package would be."""
    module = types.ModuleType("my_tasks")
    module.EchoTask = EchoTask
    module.NoDemoTask = NoDemoTask
    module.not_a_task = 42
    monkeypatch.setitem(sys.modules, "my_tasks", module)
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "no_such_pkg.tasks, my_tasks")  # the operator allows them
    return module


def test_a_dotted_path_outside_the_allowed_packages_is_refused_before_any_import(monkeypatch):
    module = types.ModuleType("my_tasks")
    module.EchoTask = EchoTask
    monkeypatch.setitem(sys.modules, "my_tasks", module)
    imported = []
    monkeypatch.setattr(task_modules.importlib, "import_module", lambda name: imported.append(name))
    for allowed in ("", "other_pkg"):
        monkeypatch.setenv("ROLLWAY_TASK_MODULES", allowed)
        with pytest.raises(pydantic.ValidationError, match="is not among the task modules this site allows"):
            runnable({"task": {"name": "my_tasks:EchoTask"}})
    with pytest.raises(pydantic.ValidationError, match="ROLLWAY_TASK_MODULES=other_pkg"):
        runnable({"task": {"name": "os:system"}})
    assert imported == []


def test_a_listed_package_does_not_open_its_submodules_unless_the_operator_says_package_star(monkeypatch):
    package, inner = types.ModuleType("my_tasks"), types.ModuleType("my_tasks.inner")
    inner.EchoTask = EchoTask
    monkeypatch.setitem(sys.modules, "my_tasks", package)
    monkeypatch.setitem(sys.modules, "my_tasks.inner", inner)
    imported = []
    real_import = task_modules.importlib.import_module
    monkeypatch.setattr(
        task_modules.importlib, "import_module", lambda name: imported.append(name) or real_import(name)
    )
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_tasks")
    with pytest.raises(pydantic.ValidationError) as info:
        runnable({"task": {"name": "my_tasks.inner:EchoTask"}})
    message = str(info.value)
    assert "task.name 'my_tasks.inner:EchoTask': module 'my_tasks.inner' is not among the task modules" in message
    assert "ROLLWAY_TASK_MODULES=my_tasks" in message and "'package.*'" in message
    assert imported == []
    for allowed in ("my_tasks.inner", "my_tasks.*"):
        monkeypatch.setenv("ROLLWAY_TASK_MODULES", allowed)
        assert task_class("my_tasks.inner:EchoTask") is EchoTask
    assert imported == ["my_tasks.inner", "my_tasks.inner"]


def test_builtin_names_resolve_lazily_to_their_classes():
    assert BUILTINS["reverse"] == "workers.rl_tasks.reverse:ReverseTask"
    assert task_class("reverse") is ReverseTask
    assert task_class("countdown") is CountdownTask
    assert isinstance(make_task(TaskConfig(name="countdown")), CountdownTask)


def test_a_dotted_path_names_a_users_task(user_module):
    cfg = runnable({"task": {"name": "my_tasks:EchoTask"}})
    task = make_task(cfg.task)
    assert isinstance(task, EchoTask)
    assert task.reward("a", "a") == 1.0 and task.sample(3, random.Random(0))[0][0].endswith("=")


def test_an_entry_point_names_a_users_task(user_module, monkeypatch):
    def fake_entry_points(group=None, name=None):
        eps = [EntryPoint(name="echo", value="my_tasks:EchoTask", group=registry.ENTRY_POINT_GROUP)]
        return EntryPoints(ep for ep in eps if ep.group == group and (name is None or ep.name == name))

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    assert task_class("echo") is EchoTask
    assert isinstance(make_task(runnable({"task": {"name": "echo"}}).task), EchoTask)


def test_an_unknown_name_is_a_config_error_listing_the_builtins():
    with pytest.raises(pydantic.ValidationError) as info:
        runnable({"task": {"name": "sudoku"}})
    (err,) = info.value.errors()
    assert err["loc"] == ("task", "name")
    assert "unknown task.name 'sudoku'" in err["msg"]
    for name in BUILTINS:
        assert name in err["msg"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("no_such_pkg.tasks:Task", "cannot import module 'no_such_pkg.tasks'"),
        ("my_tasks:Missing", "has no 'Missing'"),
        ("my_tasks:not_a_task", "is not a task class"),
        ("my tasks:Echo", "not a valid 'package.module:ClassName' path"),
    ],
)
def test_a_dotted_path_that_cannot_serve_is_refused_at_validation(user_module, name, says):
    with pytest.raises(pydantic.ValidationError, match="task.name") as info:
        runnable({"task": {"name": name}})
    assert says in str(info.value)


def test_calculator_is_reserved_and_says_so_when_its_module_is_absent(monkeypatch):
    # Whether or not workers.rl_tasks.tool_task exists in this tree, a missing module is a
    # clear error naming the built-in task (never an ImportError from deep inside).
    monkeypatch.setitem(BUILTINS, "calculator", "workers.no_such_tool_task:CalculatorTask")
    with pytest.raises(UnknownTask, match="'calculator' is a built-in task whose module"):
        task_class("calculator")


def test_task_options_are_checked_by_the_task():
    with pytest.raises(pydantic.ValidationError, match=r"task.options.count"):
        runnable({"task": {"name": "countdown", "options": {"count": 9}}})
    with pytest.raises(pydantic.ValidationError, match=r"task.options.colour"):
        runnable({"task": {"name": "countdown", "options": {"colour": "red"}}})
    with pytest.raises(pydantic.ValidationError, match="takes no options"):
        runnable({"task": {"name": "reverse", "options": {"count": 3}}})


def test_lengths_of_the_new_tasks_are_checked_against_the_model():
    with pytest.raises(
        pydantic.ValidationError, match=r"inference.max_new_tokens \(8\) must be ≥ the longest countdown"
    ):
        runnable({"task": {"name": "countdown"}})
    with pytest.raises(pydantic.ValidationError, match=r"model.max_position_embeddings \(64\) must be ≥"):
        runnable({"task": {"name": "gsm8k"}, "inference": {"max_new_tokens": 20}})
    runnable({"task": {"name": "gsm8k"}, "inference": {"max_new_tokens": 20}, "model": {"max_position_embeddings": 80}})


def test_a_warm_start_needs_a_task_with_demonstrations(user_module):
    with pytest.raises(pydantic.ValidationError, match="warm_start.steps and warm_start.noisy_steps to 0"):
        runnable({"task": {"name": "my_tasks:NoDemoTask"}})
    runnable({"task": {"name": "my_tasks:NoDemoTask"}, "warm_start": {"steps": 0, "noisy_steps": 0}})


def test_a_task_without_demonstrations_builds_its_policy_with_the_warm_start_off(user_module, tmp_path):
    from workers.model.loading import load_model
    from workers.train.warmstart import build_policy

    cfg = runnable({"task": {"name": "my_tasks:NoDemoTask"}, "warm_start": {"steps": 0, "noisy_steps": 0}})
    build_policy(cfg, str(tmp_path / "policy"))
    assert load_model(str(tmp_path / "policy")).config.num_hidden_layers == cfg.model.num_layers
