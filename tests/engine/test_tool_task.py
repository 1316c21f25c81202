"""The calculator tool (workers/rl_tasks/tools.py) and the calculator task's protocol and reward
(workers/rl_tasks/tool_task.py), against hand-written cases, malformed calls included."""

from __future__ import annotations

import random

import pytest

from workers.model.tokenizer import DEFAULT_CHARS, CharTokenizer
from workers.rl_tasks.tool_task import CalculatorTask, final_answer, tool_result
from workers.rl_tasks.tools import MAX_INPUT_CHARS, calculate


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*7", "84"),
        ("12*7+3", "87"),
        ("2+3*4", "14"),  # precedence
        ("(2+3)*4", "20"),
        ("7/2", "7/2"),  # exact, reduced
        ("6/4", "3/2"),
        ("8/4", "2"),
        ("0.1+0.2", "3/10"),  # decimals are exact too
        ("-3+-2", "-5"),
        ("+5", "5"),
        (" 1 + 1 ", "2"),
        ("10-20", "-10"),
        ("1/3+1/3+1/3", "1"),
    ],
)
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1/0", "error: division by zero"),
        ("5/(2-2)", "error: division by zero"),
        ("2**3", "error: only + - * / are supported"),
        ("7//2", "error: only + - * / are supported"),
        ("7%2", "error: use only digits, + - * / and parentheses"),
        ("__import__('os')", "error: use only digits, + - * / and parentheses"),
        ("abc", "error: use only digits, + - * / and parentheses"),
        ("1e9", "error: use only digits, + - * / and parentheses"),
        ("", "error: empty expression"),
        ("1+", "error: not a valid expression"),
        ("(1+2", "error: not a valid expression"),
        ("1.2.3", "error: not a valid expression"),
        ("007", "error: not a valid expression"),
        ("1234567890123", "error: numbers are limited to 12 digits"),
        ("999999999999*999999999999*999999999999", "error: result too large, over 24 digits"),
        ("1+" * 40 + "1", f"error: expression longer than {MAX_INPUT_CHARS} characters"),
    ],
)
def test_calculator_refuses_with_a_message(expression, message):
    assert calculate(expression) == message


def test_every_tool_output_is_expressible_by_the_char_tokenizer():
    """Values and messages alike: the environment's turn must encode."""
    tok = CharTokenizer()
    for expression in ["12*7", "7/2", "-1", "1/0", "2**3", "x", "", "9" * 13, "9" * 12 + "*" + "9" * 12 + "*9" * 6]:
        text = tool_result(expression)
        assert set(text) <= set(DEFAULT_CHARS), text
        assert tok.decode(tok.encode(text)) == text


def test_tool_result_format():
    assert tool_result("12*7") == "=84 "
    assert tool_result("1/0") == "=error: division by zero "


def test_find_call_needs_the_whole_call():
    task = CalculatorTask()
    assert task.find_call("calc:12*7") is None
    assert task.find_call("calc:12*7?") == "12*7"
    assert task.find_call("12*7?") is None  # no prefix: not a call
    assert task.find_call("cal:1+1?") is None
    assert task.find_call("hmm calc:1+1?") == "1+1"
    assert task.find_call("calc:?") == ""  # an empty call is still a call; the tool answers it


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("calc:12*7+3?=87 87", "87"),
        ("87", "87"),  # no call: the whole text is the answer
        ("calc:12*7?=84 calc:84+3?=87 87", "87"),  # two calls
        ("calc:1/0?=error: division by zero 5", "5"),  # a result with spaces is skipped whole
        ("calc:12*7+3?=87 ", ""),  # ended right after the result: no answer
        ("calc:12*7+3?", ""),  # ended on the call (turn limit)
        ("calc:12*7+3?=87 86", "86"),
    ],
)
def test_final_answer(text, answer):
    assert final_answer(text) == answer


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("calc:12*7+3?=87 87", 1.0),
        ("87", 1.0),  # answering without the tool is allowed
        ("87.0", 1.0),  # the same number
        ("calc:12*7+3?=87 86", 0.0),
        ("calc:12*7+3?=87 ", 0.0),  # never answered: the tool's result earns nothing
        ("calc:12*7+3?", 0.0),
        ("", 0.0),
        ("calc:12*7+3?=87 abc", 0.0),  # not a number
        ("calc:12*?=error: not a valid expression 87", 1.0),  # a malformed call, then right
        ("calc:1/0?=error: division by zero 0", 0.0),
    ],
)
def test_reward(completion, reward):
    assert CalculatorTask().reward(completion, "87") == reward


def test_sample_answers_are_the_calculators_and_the_demonstration_earns_full_reward():
    task = CalculatorTask(max_operand=20, min_terms=2, max_terms=3)
    tok = CharTokenizer()
    pairs = task.sample(50, random.Random(0))
    assert len(pairs) == 50 and len({p for p, _ in pairs}) > 30
    for prompt, answer in pairs:
        assert prompt.endswith("=") and calculate(prompt[:-1]) == answer
        demo = task.demonstration(prompt, answer)
        assert demo == f"calc:{prompt[:-1]}?={answer} {answer}"
        tok.encode(prompt + demo)  # every character is in the vocabulary
        assert task.reward(demo, answer) == 1.0
        turns = task.demonstration_turns(prompt, answer)
        assert [is_model for _, is_model in turns] == [True, False, True]
        assert "".join(t for t, _ in turns) == demo


def test_one_turn_demonstration_has_no_call():
    task = CalculatorTask(max_turns=1)
    assert task.demonstration("2+3=", "5") == "5"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"min_terms": 1}, "min_terms"),
        ({"min_terms": 3, "max_terms": 2}, "max_terms"),
        ({"max_operand": 0}, "max_operand"),
        ({"operators": "/"}, "operators"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CalculatorTask(**kwargs)


# --- the chat template's format ---------------------------------------------------------


def test_a_json_call_is_found_in_either_key_and_its_output_is_the_value_alone():
    task = CalculatorTask()
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7+3"}}'
    assert task.find_call(call) == "12*7+3"
    assert task.find_call('{"name":"calculator","parameters":{"expression":"1/3"}}') == "1/3"
    assert task.find_call('{"name": "calculator", "arguments": {"expression": "12*7') is None  # not closed yet
    assert task.find_call('{"name": "search", "arguments": {"expression": "1"}}') is None
    assert task.tool_output("12*7+3") == "87" and task.tool_output("1/0") == "error: division by zero"
    assert [t["function"]["name"] for t in task.tools] == ["calculator"]


def test_after_a_json_call_the_answer_is_the_last_line_after_the_rendered_result():
    call = '{"name": "calculator", "arguments": {"expression": "12*7+3"}}'
    rendered = "\ntool\n87\nassistant\n"
    assert final_answer(call + rendered + "87") == "87"
    assert CalculatorTask().reward(call + rendered + "87", "87") == 1.0
    assert CalculatorTask().reward(call + rendered, "87") == 0.0  # no answer after the result
    assert CalculatorTask().reward(call + rendered + "86", "87") == 0.0
