"""The countdown and math-answer verifiers on hand-written cases, malformed ones included,
and the problems the gsm8k generator draws."""

from __future__ import annotations

import operator
import random
import re
from fractions import Fraction

import pytest

from workers.config.run_config import TaskConfig
from workers.rl_tasks import make_task
from workers.rl_tasks.countdown import MAX_EXPRESSION_CHARS, evaluate, parse_problem, solve
from workers.rl_tasks.gsm8k import GSM8KTask
from workers.rl_tasks.math_answer import final_answer, parse_number, same_answer

COUNTDOWN = make_task(TaskConfig(name="countdown"))
GSM8K = make_task(TaskConfig(name="gsm8k"))
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("3*5+7", "3 5 7:22", 1.0),
        ("7+3*5", "3 5 7:22", 1.0),
        ("(7+5)*3-14", "3 5 7 14:22", 1.0),
        ("  (5 + 7) * 3 - 14 ", "3 5 7 14:22", 1.0),  # spaces are fine
        ("8/(3-8/3)", "3 3 8 8:24", 1.0),  # exact division: 8/3 is not rounded
        ("5*7", "3 5 7:22", 0.1),  # well formed, allowed numbers, wrong value
        ("5", "3 5 7:22", 0.1),
        ("3*5+8", "3 5 7:22", 0.0),  # 8 was not given
        ("3*5+7+7", "3 5 7:22", 0.0),  # 7 used twice
        ("22", "3 5 7:22", 0.0),
        ("3*5+", "3 5 7:22", 0.0),  # malformed
        ("", "3 5 7:22", 0.0),
        ("-3+25", "3 5 7:22", 0.0),  # unary minus is not an operator here
        ("3**5", "3 5 7:22", 0.0),  # no powers at all
        ("5/(3-3)", "3 3 5:1", 0.0),  # division by zero
        ("3.0*5+7", "3 5 7:22", 0.0),  # integers only
        ("__import__('os')", "3 5 7:22", 0.0),
        ("(" * 60 + "3" + ")" * 60, "3 5 7:3", 0.0),  # too long to parse
    ],
)
def test_countdown_reward(completion, answer, expected):
    assert COUNTDOWN.reward(completion, answer) == pytest.approx(expected)


def test_countdown_refuses_long_expressions_before_parsing():
    assert evaluate("1+" * MAX_EXPRESSION_CHARS + "1", [1] * 500) is None
    assert evaluate("((3))", [3]) == Fraction(3)


def test_countdown_problems_are_solvable_and_their_demonstrations_earn_full_reward():
    pairs = COUNTDOWN.sample(200, random.Random(3))
    assert pairs == COUNTDOWN.sample(200, random.Random(3))
    for prompt, answer in pairs:
        numbers, target = parse_problem(answer)
        assert prompt == answer + "=" and len(numbers) == 3 and 1 <= target <= 100
        assert COUNTDOWN.reward(COUNTDOWN.demonstration(prompt, answer), answer) == 1.0


def test_countdown_solver_finds_the_fewest_operations_or_none():
    assert solve((3, 5, 7), 22) in ("3*5+7", "5*3+7", "7+3*5", "7+5*3")
    assert solve((3, 5, 7), 5) == "5"
    assert solve((1, 1), 100) is None
    with pytest.raises(ValueError, match="no solution"):
        COUNTDOWN.demonstration("1 1:100=", "1 1:100")
    with pytest.raises(ValueError, match="not 'n1 n2"):
        parse_problem("3 5 7")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("1,234", Fraction(1234)),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("-3", Fraction(-3)),
        ("+3", Fraction(3)),
        ("\u22123", Fraction(-3)),
        ("0.50", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        ("$12.", Fraction(12)),
        ("-$5", Fraction(-5)),
        ("3/0", None),
        ("1,23", None),  # not a thousands grouping
        ("abc", None),
        ("", None),
        ("4 5", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3+4=7 #### 7", Fraction(7)),
        ("she has 1,200 now.\n#### 1,200", Fraction(1200)),
        ("#### 3 #### 5", Fraction(5)),  # the last marker counts
        ("the answer is 10-3", Fraction(3)),  # a minus between numbers is an operator
        ("so she pays $-4.50 in the end", Fraction(-9, 2)),
        ("half: 1/2.", Fraction(1, 2)),
        ("#### ", None),  # a marker with nothing after it is no answer
        ("#### seven", None),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_final_answer(text, value):
    assert final_answer(text) == value


@pytest.mark.parametrize(
    ("completion", "reference", "same"),
    [
        ("3+4=7 #### 7", "3+4=7 #### 7", True),
        ("it is 7", "#### 7", True),  # no marker: the last number
        ("#### 7.0", "#### 7", True),
        ("#### 1/2", "#### 0.5", True),
        ("#### 1,000", "#### 1000", True),
        ("#### 8", "#### 7", False),
        ("#### -7", "#### 7", False),
        ("#### 7 apples, 8 pears", "#### 7", True),  # the first number after the marker
        ("####", "#### 7", False),
        ("7", "no answer in the reference", False),
    ],
)
def test_same_answer(completion, reference, same):
    assert same_answer(completion, reference) is same


def test_gsm8k_samples_problems_whose_reference_earns_full_reward():
    pairs = GSM8K.sample(100, random.Random(0))
    for prompt, answer in pairs:
        assert prompt.endswith("?") and " #### " in answer
        assert GSM8K.reward(GSM8K.demonstration(prompt, answer), answer) == 1.0
        assert GSM8K.reward(answer.replace("####", "#### 1"), answer) == 0.0


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_gsm8k_chains_steps_on_the_running_total_and_the_reference_earns_full_reward(steps):
    task = make_task(TaskConfig(name="gsm8k", options={"max_number": 9, "steps": steps}))
    longest = GSM8KTask.lengths(TaskConfig(name="gsm8k", options={"max_number": 9, "steps": steps}))
    for prompt, answer in task.sample(300, random.Random(steps)):
        work, final = answer.split(" #### ")
        equations = work.split(" ")
        assert len(equations) == steps and prompt.endswith("how many now?")
        total = None
        for equation in equations:
            left, result = equation.split("=")
            a, op, b = re.fullmatch(r"(\d+)([-+*/])(\d+)", left).groups()
            assert total is None or int(a) == total  # each step starts from the last one's result
            assert OPERATORS[op](int(a), int(b)) == int(result) and 0 <= int(result) <= 81  # exact, within 9²
            total = int(result)
        assert int(final) == total
        assert task.reward(task.demonstration(prompt, answer), answer) == 1.0
        assert task.reward(f"{work} #### {total + 1}", answer) == 0.0
        assert len(prompt) <= longest.prompt and len(answer) <= longest.answer


def test_gsm8k_one_step_problems_are_drawn_as_before_the_steps_option():
    # The shipped data and the documented warm starts were drawn from this stream.
    assert GSM8K.sample(3, random.Random(0)) == ONE_STEP_DRAWS


ONE_STEP_DRAWS = [
    ("28 keys are shared by 2 kids. how many each?", "28/2=14 #### 14"),
    ("130 cups are shared by 10 kids. how many each?", "130/10=13 #### 13"),
    ("cy has 17 eggs and gives away 5. how many are left?", "17-5=12 #### 12"),
]
