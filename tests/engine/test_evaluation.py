"""The eval pass's pieces without Ray: the pass@k estimator, the metrics of a pass, when a
pass is due, the held-out prompts and their exclusion from training, the config
section's checks, and one pass through the real torch backend."""

from __future__ import annotations

import os
import random

import pytest
from pydantic import ValidationError

from tests.engine.helpers import small_config
from workers.config.run_config import RunConfig, TaskConfig
from workers.core.metric_names import NAMES
from workers.inference.torch_backend import TorchBackend
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rollout.evaluation import (
    HELD_OUT_BUCKETS,
    PASS_AT_1,
    PASS_AT_K,
    REWARD_MEAN,
    SERIES,
    WithoutHeldOut,
    eval_metrics,
    eval_prompts,
    evaluate,
    held_out_prompts,
    is_due,
    is_held_out,
    pass_at_k,
    problem_key,
    training_prompts,
)
from workers.rollout.shipped_data import DATA_DIR
from workers.rollout.task_data import DatasetPrompts

# -- the estimator ------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        # By hand: 1 − C(n−c, k)/C(n, k).
        (4, 1, 1, 0.25),  # 1 − 3/4
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
        (10, 3, 5, 1 - 21 / 252),  # C(7,5) = 21, C(10,5) = 252
        (3, 1, 3, 1.0),  # n = k: any correct sample passes
        (3, 0, 3, 0.0),  # n = k, none correct
        (6, 0, 2, 0.0),  # c = 0: never
        (6, 6, 2, 1.0),  # c = n: always
        (6, 5, 2, 1.0),  # n − c < k: every draw of k holds a correct one
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    assert all(pass_at_k(8, c, 1) == pytest.approx(c / 8) for c in range(9))


@pytest.mark.parametrize("n, c, k", [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_the_metrics_of_a_pass_count_only_full_rewards_as_correct():
    rewards = [
        [1.0, 0.0, 0.0, 0.0],  # one correct
        [0.1, 0.1, 0.1, 0.1],  # partial credit only: no pass
        [1.0, 1.0, 1.0, 1.0 - 1e-12],  # all correct (float noise under 1 still counts)
    ]
    m = eval_metrics(rewards, k=4)
    assert set(m) == set(SERIES) <= NAMES
    assert m[REWARD_MEAN] == pytest.approx((1.0 + 0.4 + 4.0) / 12)
    assert m[PASS_AT_1] == pytest.approx((0.25 + 0.0 + 1.0) / 3)
    assert m[PASS_AT_K] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert m[PASS_AT_K] >= m[PASS_AT_1]


def test_the_metrics_need_k_rewards_per_prompt():
    with pytest.raises(ValueError, match="k=4"):
        eval_metrics([[1.0, 0.0]], k=4)


# -- when -----------------------------------------------------------------------------


def test_a_pass_is_due_at_each_multiple_and_moves_to_the_next_version_when_one_is_skipped():
    assert [v for v in range(9) if is_due(v, 0, 2)] == [2, 3, 4, 5, 6, 7, 8]  # none yet
    assert not is_due(3, 2, 2) and is_due(4, 2, 2)  # one pass per multiple
    assert is_due(5, 2, 2)  # 4 was skipped: the pass runs at 5
    assert not is_due(5, 5, 2)
    assert not any(is_due(v, 0, 0) for v in range(10))  # every_steps 0: off


# -- the held-out prompts ---------------------------------------------------------------


def test_the_held_out_prompts_are_distinct_fixed_by_the_seed_and_never_trained_on():
    cfg = small_config(task={"name": "countdown"}, inference={"max_new_tokens": 13}, eval={"every_steps": 2})
    task = make_task(cfg.task)
    held = eval_prompts(cfg, task)
    assert len(held) == cfg.eval.num_prompts == len({problem_key(task, *pair) for pair in held})
    assert held == held_out_prompts(make_task(cfg.task), cfg.eval.num_prompts, cfg.seed)  # every worker's
    assert held != held_out_prompts(task, cfg.eval.num_prompts, cfg.seed + 1)

    source = training_prompts(cfg, task, task)
    assert isinstance(source, WithoutHeldOut)
    drawn = source.sample(20_000, random.Random(0))
    assert len(drawn) == 20_000
    # The generator on its own draws held-out prompts at this rate; the source never does.
    assert {p for p, _ in task.sample(20_000, random.Random(0))} & {p for p, _ in held}
    assert not {p for p, _ in drawn} & {p for p, _ in held}


TASKS_WITH_KEYS = [  # the task's config sections
    {"task": {"name": "countdown", "options": {"count": 2}}, "inference": {"max_new_tokens": 13}},
    {"task": {"name": "countdown"}, "inference": {"max_new_tokens": 13}},
    {
        "task": {"name": "gsm8k", "options": {"max_number": 9}},
        "inference": {"max_new_tokens": 16},
        "model": {"max_position_embeddings": 80},
    },
]


@pytest.mark.parametrize("sections", TASKS_WITH_KEYS)
def test_no_wording_of_a_held_out_problem_reaches_training_whatever_the_seed(sections):
    """The reserved share is a property of the problem (its key), not of one run's eval
    set: training of any seed, and the warm start, never draw a problem that any seed's
    eval set holds, in any wording (countdown's numbers in another order, gsm8k's sum
    with other names)."""
    from workers.train.warmstart import demonstrations

    cfg = small_config(**sections, eval={"every_steps": 1, "num_prompts": 16})
    task = make_task(cfg.task)
    held_keys = {
        problem_key(task, *pair) for seed in range(3) for pair in held_out_prompts(task, cfg.eval.num_prompts, seed)
    }
    assert all(is_held_out(k) for k in held_keys)
    raw = task.sample(20_000, random.Random(1))
    # The generator emits other wordings of held-out problems (a prompt never evaluated
    # whose problem is): excluding the eval prompts' text alone would let them train.
    held_texts = {p for seed in range(3) for p, _ in held_out_prompts(task, cfg.eval.num_prompts, seed)}
    assert any(problem_key(task, p, a) in held_keys and p not in held_texts for p, a in raw)
    for seed in range(3):
        seeded = cfg.model_copy(update={"seed": seed})
        for source in (training_prompts(seeded, task, task), demonstrations(seeded)[0]):
            drawn = source.sample(5_000, random.Random(seed))
            assert not any(is_held_out(problem_key(task, *pair)) for pair in drawn)


def test_the_held_out_share_is_about_one_in_its_buckets_and_the_same_in_every_process():
    keys = [f"{a} {b}:{a + b}" for a in range(1, 60) for b in range(a, 60)]
    share = sum(map(is_held_out, keys)) / len(keys)
    assert abs(share - 1 / HELD_OUT_BUCKETS) < 0.03
    # sha256, not hash(): a fixed answer for a fixed key.
    assert [is_held_out(k) for k in ("1 2:3", "2 9:18", "3 5:8")] == [
        int.from_bytes(__import__("hashlib").sha256(k.encode()).digest()[:8], "big") % HELD_OUT_BUCKETS == 0
        for k in ("1 2:3", "2 9:18", "3 5:8")
    ]


def test_countdown_and_gsm8k_key_a_problem_by_its_content_not_its_wording():
    countdown = make_task(TaskConfig(name="countdown"))
    assert problem_key(countdown, "3 5 7:22=", "3 5 7:22") == problem_key(countdown, "7 3 5:22=", "7 3 5:22")
    assert problem_key(countdown, "3 5 7:22=", "3 5 7:22") != problem_key(countdown, "3 5 7:23=", "3 5 7:23")
    gsm8k = make_task(TaskConfig(name="gsm8k"))
    one = problem_key(gsm8k, "ann has 3 pens and gets 4 more. how many pens now?", "3+4=7 #### 7")
    assert one == problem_key(gsm8k, "bo has 3 eggs and gets 4 more. how many eggs now?", "3+4=7 #### 7")
    reverse = make_task(TaskConfig(name="reverse"))
    assert problem_key(reverse, "abc=", "cba") == "abc="  # no key of its own: the prompt


def test_without_eval_or_with_a_dataset_training_draws_from_its_source_unchanged():
    task = make_task(small_config().task)
    assert training_prompts(small_config(), task, task) is task
    cfg = small_config(task={"name": "countdown", "dataset": {"path": os.path.join(DATA_DIR, "countdown.jsonl")}})
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"every_steps": 1})})
    assert training_prompts(cfg, task, task) is task  # the train split excludes the eval rows already


def test_a_dataset_task_evaluates_on_its_eval_split():
    from workers.rollout.task_data import load_splits

    cfg = small_config(
        task={"name": "countdown", "dataset": {"path": os.path.join(DATA_DIR, "countdown.jsonl")}},
        inference={"max_new_tokens": 13},
        eval={"every_steps": 2, "num_prompts": 8},
    )
    splits = load_splits(cfg)
    held = eval_prompts(cfg, make_task(cfg.task))
    assert held == splits.eval[:8]
    assert not {p for p, _ in held} & {p for p, _ in splits.train}


def test_a_generator_too_small_for_the_held_out_set_is_refused_naming_the_field():
    cfg = small_config(task={"min_len": 1, "max_len": 1, "alphabet": "ab"}, eval={"every_steps": 1, "num_prompts": 3})
    with pytest.raises(ValueError, match=r"eval\.num_prompts \(3\).*only [0-2] distinct held-out problems"):
        eval_prompts(cfg, make_task(cfg.task))


def test_a_source_that_yields_only_held_out_prompts_is_refused():
    task = make_task(small_config(task={"min_len": 3, "max_len": 3}).task)
    held = held_out_prompts(task, 2, seed=0)
    only_held = WithoutHeldOut(DatasetPrompts(held), task)  # a source of nothing but reserved problems
    with pytest.raises(ValueError, match="almost only held-out prompts"):
        only_held.sample(1, random.Random(0))


# -- the config -----------------------------------------------------------------------


def test_eval_is_off_by_default():
    assert RunConfig().eval.every_steps == 0


@pytest.mark.parametrize(
    "section, field",
    [
        ({"every_steps": -1}, "every_steps"),
        ({"num_prompts": 0}, "num_prompts"),
        ({"k": 0}, "k"),
        ({"temperature": 0}, "temperature"),
        ({"samples": 4}, "samples"),
    ],
)
def test_bad_eval_settings_are_refused_naming_the_field(section, field):
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate({"eval": section})
    assert err.value.errors()[0]["loc"] == ("eval", field)


def test_eval_on_a_dataset_with_no_held_out_rows_is_refused_naming_the_fields():
    dataset = {"path": os.path.join(DATA_DIR, "countdown.jsonl"), "eval_fraction": 0}
    with pytest.raises(ValidationError, match=r"eval\.every_steps > 0 needs held-out rows.*task\.dataset\.eval_frac"):
        RunConfig.model_validate(
            {
                "task": {"name": "countdown", "dataset": dataset},
                "inference": {"max_new_tokens": 13},
                "eval": {"every_steps": 2},
            }
        )
    RunConfig.model_validate({"task": {"name": "countdown", "dataset": dataset}, "inference": {"max_new_tokens": 13}})


# -- one pass on the real backend -------------------------------------------------------


def test_a_pass_on_the_torch_backend_scores_k_completions_per_prompt(tiny_model_dir):
    cfg = small_config(eval={"every_steps": 1, "num_prompts": 6, "k": 3})
    task = make_task(cfg.task)
    prompts = eval_prompts(cfg, task)
    backend, tokenizer = TorchBackend(tiny_model_dir), CharTokenizer.load(tiny_model_dir)
    m = evaluate(backend, task, tokenizer, prompts, cfg.eval, cfg.inference.max_new_tokens, seed=0)
    assert set(m) == set(SERIES)
    assert all(0.0 <= v <= 1.0 for v in m.values())
    assert m[PASS_AT_K] >= m[PASS_AT_1]
    # The same seed and weights give the same figures: passes differ by their weights only.
    assert evaluate(backend, task, tokenizer, prompts, cfg.eval, cfg.inference.max_new_tokens, seed=0) == m


def test_a_multi_turn_task_is_evaluated_on_whole_episodes():
    """The calculator through its episode path: a policy that calls the tool and then
    answers passes every prompt; one that answers without the call's result, none."""
    from tests.engine.test_episodes import TOK, ScriptedBackend
    from workers.rl_tasks.tool_task import CalculatorTask

    cfg = small_config(eval={"every_steps": 1, "k": 2})
    prompts = [("12*7+3=", "87"), ("2-9=", "-7")]
    m = evaluate(ScriptedBackend(), CalculatorTask(), TOK, prompts, cfg.eval, max_new_tokens=40, seed=0)
    assert m == {REWARD_MEAN: 1.0, PASS_AT_1: 1.0, PASS_AT_K: 1.0}
    wrong = ScriptedBackend(lambda expression: ["5"])
    m = evaluate(wrong, CalculatorTask(), TOK, prompts, cfg.eval, max_new_tokens=40, seed=0)
    assert m == {REWARD_MEAN: 0.0, PASS_AT_1: 0.0, PASS_AT_K: 0.0}
