"""task.reward_funcs: reward functions in TRL's shape, checked at launch, summed with
their weights, None left out, and each one's rewards/<name>/mean|std series."""

from __future__ import annotations

import json
import math
import random
import re
import sys
import types

import pydantic
import pytest

from tests.engine.helpers import small_config
from workers.config.run_config import RunConfig
from workers.core.metric_names import REWARD_FUNC_NAME_MAX, metric_of, reward_func_series, reward_func_series_name
from workers.core.records import Group, Rollout
from workers.inference.torch_backend import TorchBackend
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rl_tasks.reward_funcs import RewardFuncError, RewardFuncTask
from workers.rollout.generation import generate_groups
from workers.rollout.task_data import DatasetError, load_splits
from workers.run.runnable import check_runnable
from workers.train.batch_stats import batch_metrics

# The site's rule for series names (platform/runs/reports.py SERIES_PATTERN).
SERIES = re.compile(r"^[a-z0-9_./@-]{1,64}$")
CALLS: list[dict] = []


def exact(prompts, completions, answer, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def short(completions, **kwargs):
    return [0.5 if len(c) < 3 else 0.0 for c in completions]


def only_odd_ids(completions, kind):
    # No **kwargs: passed only what it names.
    return [None if k == "even" else 1.0 for k in kind]


def chatty(prompts, completions, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, **kwargs})
    return [float(len(c[0]["content"])) for c in completions]


def no_completions(prompts, answer):
    return [0.0]


def wants_solution(prompts, completions, solution):
    return [0.0 for _ in completions]


def raises(prompts, completions, **kwargs):
    raise KeyError("boom")


def numpy_values(completions, **kwargs):
    import numpy as np

    return [np.float32(0.5), np.float64("nan"), True][: len(completions)]


def text(completions, **kwargs):
    return ["1.0" for _ in completions]


def a_very_long_reward_function_name_that_would_overflow_the_series_column_limit(completions, **kwargs):
    return [0.0 for _ in completions]


@pytest.fixture
def rewards_module(monkeypatch):
    """A user's module `my_rewards` holding the functions above, allowed by the operator."""
    module = types.ModuleType("my_rewards")
    for f in (
        exact,
        short,
        only_odd_ids,
        chatty,
        no_completions,
        wants_solution,
        raises,
        numpy_values,
        text,
        a_very_long_reward_function_name_that_would_overflow_the_series_column_limit,
    ):
        setattr(module, f.__name__, f)
    monkeypatch.setitem(sys.modules, "my_rewards", module)
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_rewards")
    CALLS.clear()
    return module


def config(**task) -> RunConfig:
    """A copy run's config as a launch takes it: its values validated, then its task resolved."""
    return check_runnable(RunConfig.model_validate({"task": {"name": "copy", **task}}))


def test_a_reward_function_in_a_submodule_of_a_listed_package_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setitem(sys.modules, "my_rewards.inner", types.ModuleType("my_rewards.inner"))
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_rewards")
    with pytest.raises(pydantic.ValidationError) as info:
        config(reward_funcs=["my_rewards.inner:f"])
    message = str(info.value)
    assert "task.reward_funcs: 'my_rewards.inner:f': module 'my_rewards.inner' is not among" in message
    assert "ROLLWAY_TASK_MODULES=my_rewards" in message


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ({"reward_funcs": ["my_rewards.exact"]}, "is not a 'package.module:function' path"),
        ({"reward_funcs": ["my_rewards:missing"]}, "has no function 'missing'"),
        ({"reward_funcs": ["no_pkg.mod:f"]}, "is not among the reward-function modules this site allows"),
        ({"reward_funcs": ["my_rewards:no_completions"]}, "takes no 'completions' argument"),
        ({"reward_funcs": ["my_rewards:exact"], "reward_weights": [1.0, 2.0]}, "2 weights for 1 task.reward_funcs"),
        ({"reward_funcs": ["my_rewards:exact", "my_rewards:exact"]}, "would report under one series"),
    ],
)
def test_a_reward_function_that_cannot_serve_is_refused_naming_the_field(rewards_module, task, says):
    with pytest.raises(pydantic.ValidationError) as info:
        config(**task)
    error = info.value.errors()[0]
    assert says in error["msg"]
    field = "task.reward_weights" if "reward_weights" in task else "task.reward_funcs"
    assert field in error["msg"] or ".".join(map(str, error["loc"])) == field


def test_the_reward_is_the_weighted_sum_of_the_functions(rewards_module):
    cfg = config(reward_funcs=["my_rewards:exact", "my_rewards:short"], reward_weights=[2.0, 1.0])
    task = make_task(cfg.task)
    assert isinstance(task, RewardFuncTask)
    # Without a dataset, the task's answer is the one column.
    scores = task.score("ab=", "ba", ["ba", "abcd"], [[1, 2], [3, 4, 5, 6]])
    assert scores.totals == [2.0 * 1 + 0.5, 0.0]
    assert scores.parts == [{"exact": 1.0, "short": 0.5}, {"exact": 0.0, "short": 0.0}]
    assert CALLS[-1]["answer"] == ["ba", "ba"] and CALLS[-1]["prompts"] == ["ab=", "ab="]
    assert task.reward("ba", "ba") == 2.5  # the single-completion path agrees


def test_columns_reach_the_functions_by_name_and_none_is_not_applicable(rewards_module, tmp_path):
    rows = [{"prompt": f"{c}=", "answer": c, "kind": "even" if i % 2 else "odd"} for i, c in enumerate("abcdef")]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(
        dataset={"path": str(path), "eval_fraction": 0},
        reward_funcs=["my_rewards:exact", "my_rewards:only_odd_ids"],
        reward_weights=[1.0, 10.0],
    )
    task = make_task(cfg.task)
    train = load_splits(cfg).train
    prompt, answer = next((p, a) for p, a in train if json.loads(a)["kind"] == "even")
    scores = task.score(prompt, answer, [json.loads(answer)["answer"], "zz"], [[5], [6, 7]])
    # only_odd_ids answered None (not applicable) for an even row: nothing added, nothing counted.
    assert scores.totals == [1.0, 0.0]
    assert scores.parts == [{"exact": 1.0, "only_odd_ids": None}, {"exact": 0.0, "only_odd_ids": None}]
    call = CALLS[-1]
    assert call["prompts"] == [prompt, prompt] and call["completions"] == [json.loads(answer)["answer"], "zz"]
    assert call["kind"] == ["even", "even"] and call["completion_ids"] == [[5], [6, 7]]
    odd = next((p, a) for p, a in train if json.loads(a)["kind"] == "odd")
    assert task.score(*odd, ["x"], [[1]]).totals == [10.0]


def test_a_function_naming_a_column_the_data_lacks_is_refused_at_launch(rewards_module, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "a=", "answer": "a"}) + "\n")
    cfg = config(dataset={"path": str(path), "eval_fraction": 0}, reward_funcs=["my_rewards:wants_solution"])
    with pytest.raises(DatasetError) as info:
        load_splits(cfg)
    assert info.value.field == "task.reward_funcs" and "'solution'" in info.value.message


def test_a_function_that_raises_or_answers_badly_names_itself(rewards_module):
    task = make_task(config(reward_funcs=["my_rewards:raises"]).task)
    with pytest.raises(RewardFuncError, match="'my_rewards:raises' raised KeyError"):
        task.score("a=", "a", ["a"], [[1]])
    with pytest.raises(RewardFuncError, match="'my_rewards:text' returned '1.0'; a reward is a finite number or None"):
        make_task(config(reward_funcs=["my_rewards:text"]).task).score("a=", "a", ["a"], [[1]])
    with pytest.raises(RewardFuncError, match="'my_rewards:numpy_values' returned 3 rewards for 4 completions"):
        make_task(config(reward_funcs=["my_rewards:numpy_values"]).task).score("a=", "a", list("abcd"), [[1]] * 4)


def test_numpy_numbers_and_bools_count_and_a_nan_is_not_applicable(rewards_module):
    task = make_task(config(reward_funcs=["my_rewards:numpy_values"]).task)
    scores = task.score("a=", "a", ["a", "b", "c"], [[1], [2], [3]])
    assert scores.totals == [0.5, 0.0, 1.0]
    assert scores.parts == [{"numpy_values": 0.5}, {"numpy_values": None}, {"numpy_values": 1.0}]


def test_conversational_completions_are_assistant_messages(rewards_module, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"say {c}"}], "answer": c} for c in "abc"]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": str(tmp_path)},
            "task": {
                "name": "copy",
                "dataset": {"path": str(path), "eval_fraction": 0},
                "reward_funcs": ["my_rewards:chatty"],
            },
        }
    )
    task = make_task(cfg.task)
    prompt, answer = load_splits(cfg).train[0]
    assert task.score(prompt, answer, ["hey", "hello"], [[1], [2]]).totals == [3.0, 5.0]
    call = CALLS[-1]
    assert call["prompts"][0] == [{"role": "user", "content": f"say {json.loads(answer)['answer']}"}]
    assert call["completions"] == [
        [{"role": "assistant", "content": "hey"}],
        [{"role": "assistant", "content": "hello"}],
    ]


def test_each_function_reports_its_mean_and_std_over_the_completions_it_applied_to():
    parts = [{"exact": 1.0, "odd": None}, {"exact": 0.0, "odd": 2.0}, {"exact": 1.0, "odd": 4.0}]
    rollouts = [Rollout([1], [2], [0.0], [0], "stop", reward=1.0, reward_parts=p) for p in parts]
    metrics = batch_metrics([Group("g", "p", "a", rollouts)])
    assert metrics["rewards/exact/mean"] == pytest.approx(2 / 3)
    assert metrics["rewards/exact/std"] == pytest.approx(math.sqrt(1 / 3))  # Bessel-corrected, as TRL's nanstd
    assert metrics["rewards/odd/mean"] == 3.0 and metrics["rewards/odd/std"] == pytest.approx(math.sqrt(2))
    none_apply = [Rollout([1], [2], [0.0], [0], "stop", reward_parts={"never": None})]
    assert not any(k.startswith("rewards/") for k in batch_metrics([Group("g", "p", "a", none_apply)]))
    for name in metrics:
        assert metric_of(name) is not None, name


def test_long_or_unusual_names_make_distinct_valid_series():
    long = "a_very_long_reward_function_name_that_would_overflow_the_series_column_limit"
    names = [long, long + "_2", "accuracyReward", "AccuracyReward", "format"]
    made = [reward_func_series(n, stat) for n in names for stat in ("mean", "std")]
    assert all(SERIES.match(s) and metric_of(s) is not None for s in made)
    assert len(set(made)) == len(made)
    assert reward_func_series_name("format") == "format" and reward_func_series_name(long) == reward_func_series_name(
        long
    )  # deterministic
    assert len(reward_func_series_name(long)) == REWARD_FUNC_NAME_MAX


def test_a_real_generation_scores_groups_with_the_functions(rewards_module, tiny_model_dir):
    cfg = small_config(
        task={"name": "copy", "reward_funcs": ["my_rewards:exact", "my_rewards:short"], "reward_weights": [1.0, 2.0]},
    )
    task = make_task(cfg.task)
    prompts = task.sample(3, random.Random(0))
    groups = generate_groups(TorchBackend(tiny_model_dir), task, CharTokenizer.load(tiny_model_dir), prompts, cfg, 0, 1)
    for g in groups:
        for r in g.rollouts:
            text = CharTokenizer.load(tiny_model_dir).decode(r.completion_ids)
            assert r.reward_parts == {"exact": float(text == g.answer), "short": 0.5 if len(text) < 3 else 0.0}
            assert r.reward == r.reward_parts["exact"] + 2 * r.reward_parts["short"]
    assert {"rewards/exact/mean", "rewards/short/std"} <= set(batch_metrics(groups))


def test_the_answer_column_is_needed_only_by_a_warm_start(rewards_module, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{c}=", "kind": "odd"}) + "\n" for c in "abcd"))
    funcs = ["my_rewards:only_odd_ids"]
    dataset = {"path": str(path), "eval_fraction": 0}
    cold = RunConfig.model_validate(
        {
            "task": {"name": "copy", "dataset": dataset, "reward_funcs": funcs},
            "warm_start": {"steps": 0, "noisy_steps": 0},
        }
    )
    assert len(load_splits(cold).train) == 4
    with pytest.raises(DatasetError) as info:
        load_splits(config(dataset=dataset, reward_funcs=funcs))  # the tiny model's warm start is on
    assert info.value.field == "task.dataset.answer_column" and "warm start" in info.value.message


def test_the_wrapped_task_keeps_the_tasks_own_parts_and_survives_a_pickle(rewards_module):
    import pickle

    cfg = RunConfig.model_validate(
        {"task": {"name": "calculator", "reward_funcs": ["my_rewards:short"]}, "inference": {"max_new_tokens": 40}}
    )
    task = make_task(cfg.task)
    assert task.multi_turn and task.find_call("calc:1+2?") == "1+2" and task.tools
    again = pickle.loads(pickle.dumps(task))
    assert again.score("1+2=", "3", ["3"], [[1]]).totals == [0.5]


def test_the_dataset_task_is_its_rows_and_its_functions_and_nothing_else(rewards_module, tmp_path, tiny_model_dir):
    """`task.name: dataset`: refused without a dataset or a function (naming each field);
    no warm start unless asked, and asking is refused; the rows' prompts generate and the
    functions alone score them."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{c}{c}=", "answer": c}) + "\n" for c in "abcdefgh"))
    dataset = {"path": str(path), "eval_fraction": 0}
    with pytest.raises(pydantic.ValidationError) as bare:
        check_runnable(RunConfig.model_validate({"task": {"name": "dataset"}}))
    assert {e["loc"] for e in bare.value.errors()} == {("task", "dataset"), ("task", "reward_funcs")}
    task_cfg = {"name": "dataset", "dataset": dataset, "reward_funcs": ["my_rewards:exact"]}
    default = RunConfig.model_validate({"task": task_cfg})
    assert check_runnable(default) is default
    assert (default.warm_start.steps, default.warm_start.noisy_steps) == (0, 0)  # nothing to demonstrate
    cfg = small_config(task=task_cfg, warm_start={"steps": 0, "noisy_steps": 0})
    with pytest.raises(pydantic.ValidationError, match="offers no demonstration"):
        check_runnable(
            RunConfig.model_validate(
                {
                    "task": {"name": "dataset", "dataset": dataset, "reward_funcs": ["my_rewards:exact"]},
                    "warm_start": {"steps": 5},
                }
            )
        )
    task = make_task(cfg.task)
    rows = load_splits(cfg).train[:3]
    tokenizer = CharTokenizer.load(tiny_model_dir)
    groups = generate_groups(TorchBackend(tiny_model_dir), task, tokenizer, rows, cfg, 0, 1)
    for (_prompt, answer), g in zip(rows, groups, strict=True):
        want = json.loads(answer)["answer"]
        for r in g.rollouts:
            assert r.reward == float(tokenizer.decode(r.completion_ids) == want)
    assert CALLS[-1]["answer"] == [json.loads(rows[-1][1])["answer"]] * cfg.trainer.group_size
