"""A multi-turn tool-use task: answer an arithmetic question, calling a calculator first.

The text protocol (every character is in the char tokenizer's vocabulary):

- prompt: the question, an expression followed by "=": ``12*7+3=``
- a model turn either ends with a tool call ``calc:<expression>?`` (the turn stops at
  the "?"), or is the final answer, a number ending the episode with EOS;
- the environment answers a call with the calculator's result as the next turn,
  ``=<value> `` (workers/rl_tasks/tools.py: an integer, a reduced fraction "7/2", or a message
  "error: ..." for a malformed call), and the model continues from there.

A correct episode: ``12*7+3=`` → ``calc:12*7+3?`` ``=87 `` ``87`` EOS. The reward is the
verifier's: 1 if the final answer (the text after the last tool result) equals the
answer as a number, else 0; an episode that never answers (the turn limit or the token
budget reached right after a call) scores 0.

A checkpoint whose chat template renders tools sees the format it was trained on
instead: the calculator's JSON schema (`TOOLS`) goes into the prompt through
`apply_chat_template(tools=...)`, a call is a JSON object
``{"name": "calculator", "arguments": {"expression": "12*7+3"}}`` (as Hermes-, Qwen- and
Llama-style templates ask; "parameters" is taken for "arguments"), read from the model's
turn once the model ends it with its end-of-turn token, and its result (`tool_output`,
"87") comes back as a `tool` message rendered by the same template. The
final answer is then the last line of text after the last call's result.

The episode loop that runs it is workers/rollout/episodes.py; a task tells it that it is
multi-turn with `multi_turn = True`, and provides `find_call`, `run_tool` and `max_turns`
(and, for the chat template, `tools` and `tool_output`).
"""

from __future__ import annotations

import json
import random
import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.rl_tasks import TaskLengths
from workers.rl_tasks.tools import CalculatorError, calculate, evaluate

CALL_PREFIX = "calc:"
CALL_END = "?"
RESULT_PREFIX = "="
RESULT_END = " "
_CALL = re.compile(re.escape(CALL_PREFIX) + r"([^" + re.escape(CALL_END) + r"]*)" + re.escape(CALL_END))
TOOL_NAME = "calculator"
# The calculator as a chat template's tools take it: an OpenAI-style function schema.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Evaluate an arithmetic expression exactly (+ - * / and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12*7+3"}},
                "required": ["expression"],
            },
        },
    }
]
_JSON_CALL = re.compile(
    r'\{\s*"name"\s*:\s*"' + TOOL_NAME + r'"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
    r'\{\s*"expression"\s*:\s*("(?:[^"\\]|\\.)*")\s*\}\s*\}'
)


def _json_calls(text: str) -> list[tuple[str, int]]:
    """(expression, end) of each JSON call in `text`."""
    out = []
    for match in _JSON_CALL.finditer(text):
        try:
            out.append((str(json.loads(match.group(1))), match.end()))
        except ValueError:
            continue
    return out


def tool_result(call: str) -> str:
    """The environment's turn for the call `calc:<call>?`: "=<value> "."""
    return f"{RESULT_PREFIX}{calculate(call)}{RESULT_END}"


def final_answer(text: str) -> str:
    """The text after the last tool result of an episode's text (stripped): the model's
    answer. Each call's result is computed again here (the calculator is deterministic),
    so the result's own text, which may hold spaces, is skipped exactly; a call not
    followed by its result (the episode ended there) leaves no answer. After a JSON call
    (the chat template's format) the answer is the last line of the text after it: the
    template's rendering of the result comes first."""
    calls = _json_calls(text)
    if calls:
        lines = [line.strip() for line in text[calls[-1][1] :].splitlines() if line.strip()]
        return lines[-1] if len(lines) > 1 else ""
    start = 0
    for match in _CALL.finditer(text):
        start = match.end()
        result = tool_result(match.group(1)).strip()
        rest = text[start:]
        stripped = rest.lstrip()
        if stripped.startswith(result):
            start += len(rest) - len(stripped) + len(result)
    return text[start:].strip()


class CalculatorOptions(BaseModel):
    """`task.options` of the calculator task."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_turns: int = Field(3, ge=1, le=8, description="Model turns per episode (a call and the answer: 2).")
    min_terms: int = Field(2, ge=2, le=6, description="Fewest numbers in a question.")
    max_terms: int = Field(3, ge=2, le=6, description="Most numbers in a question.")
    max_operand: int = Field(20, ge=1, le=9999, description="Numbers are drawn from 0..max_operand.")
    operators: str = Field("+-*", min_length=1, pattern=r"^[+\-*]+$", description="Operators questions use.")

    @model_validator(mode="after")
    def _terms(self) -> CalculatorOptions:
        if self.max_terms < self.min_terms:
            raise ValueError(f"max_terms ({self.max_terms}) must be ≥ min_terms ({self.min_terms})")
        return self


class CalculatorTask:
    """Arithmetic questions of `min_terms`..`max_terms` whole numbers in 0..`max_operand`
    joined by + - *, answered after up to `max_turns - 1` calculator calls.

    Questions use no division and no parentheses: their answers are whole numbers, and
    "(" and ")" are not in the char tokenizer's vocabulary (the calculator itself takes
    both, for models whose tokenizer has them).
    """

    multi_turn = True
    Options = CalculatorOptions
    tools = TOOLS

    def __init__(
        self,
        cfg=None,
        *,
        max_turns: int = 3,
        min_terms: int = 2,
        max_terms: int = 3,
        max_operand: int = 20,
        operators: str = "+-*",
    ) -> None:
        """`cfg`: the run's TaskConfig, whose `task.options` (CalculatorOptions) set the
        rest; without one (tests, scripts) the keyword arguments do."""
        if cfg is not None:
            o = CalculatorOptions.model_validate(cfg.options)
            max_turns, min_terms, max_terms = o.max_turns, o.min_terms, o.max_terms
            max_operand, operators = o.max_operand, o.operators
        if max_turns < 1:
            raise ValueError(f"CalculatorTask max_turns must be ≥ 1 (got {max_turns})")
        if not 2 <= min_terms <= max_terms:
            raise ValueError(f"CalculatorTask needs 2 ≤ min_terms ≤ max_terms (got {min_terms}, {max_terms})")
        if max_operand < 1:
            raise ValueError(f"CalculatorTask max_operand must be ≥ 1 (got {max_operand})")
        if not operators or set(operators) - set("+-*"):
            raise ValueError(f"CalculatorTask operators must be drawn from '+-*' (got {operators!r})")
        self.cfg = cfg
        self.max_turns = max_turns
        self.min_terms = min_terms
        self.max_terms = max_terms
        self.max_operand = max_operand
        self.operators = operators

    @classmethod
    def lengths(cls, cfg) -> TaskLengths:
        """The longest question, and the longest episode a demonstration writes (the call,
        the tool's result, the answer): what `inference.max_new_tokens` must hold."""
        o = CalculatorOptions.model_validate(cfg.options)
        expression = o.max_terms * len(str(o.max_operand)) + (o.max_terms - 1)
        value = len(str(o.max_operand**o.max_terms)) + 1  # a sign for a negative one
        episode = len(CALL_PREFIX) + expression + len(CALL_END) + len(RESULT_PREFIX) + 2 * value + len(RESULT_END)
        return TaskLengths(
            prompt=expression + len(RESULT_PREFIX),
            answer=episode if o.max_turns > 1 else value,
            answer_source="the longest calculator episode: call, result and answer (task.options)",
        )

    # -- the Task protocol ------------------------------------------------------------

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """`n` (question, answer) pairs: ("12*7+3=", "87")."""
        out = []
        for _ in range(n):
            terms = [str(rng.randint(0, self.max_operand)) for _ in range(rng.randint(self.min_terms, self.max_terms))]
            expression = terms[0] + "".join(rng.choice(self.operators) + t for t in terms[1:])
            out.append((expression + "=", calculate(expression)))
        return out

    def reward(self, completion_text: str, answer: str) -> float:
        """1.0 if the episode's final answer equals `answer` as a number ("87", "+87" and
        "87.0" all count; a fraction must be exact), else 0.0."""
        given = final_answer(completion_text)
        if not given:
            return 0.0
        try:
            return 1.0 if evaluate(given) == evaluate(answer) else 0.0
        except CalculatorError:  # an answer that is not a number
            return 0.0

    # -- the environment (workers/rollout/episodes.py) -----------------------------------------

    def find_call(self, turn_text: str) -> str | None:
        """The expression of the call that ends `turn_text` (a model turn so far), in
        either format, or None while the turn holds no complete call."""
        match = _CALL.search(turn_text)
        if match:
            return match.group(1)
        calls = _json_calls(turn_text)
        return calls[0][0] if calls else None

    def run_tool(self, call: str) -> str:
        """The environment's answer to a call in the text format: "=<value> ", never an exception."""
        return tool_result(call)

    def tool_output(self, call: str) -> str:
        """The calculator's answer alone ("87", or "error: ..."): a `tool` message's content."""
        return calculate(call)

    def demonstration(self, prompt: str, answer: str) -> str:
        """A correct episode after `prompt` (for a supervised warm start): one call on the
        question's expression, its result, then the answer ("calc:12*7+3?=87 87"). The
        "=87 " part is the environment's turn: a warm start should mask it out of its
        loss as RL does (`demonstration_turns` gives the split)."""
        return "".join(text for text, _ in self.demonstration_turns(prompt, answer))

    def demonstration_turns(self, prompt: str, answer: str) -> list[tuple[str, bool]]:
        """`demonstration` as (text, is_model_turn) pieces, in order; with `max_turns`
        1 there is no turn left for a call, so the answer alone."""
        if self.max_turns == 1:
            return [(answer, True)]
        expression = prompt[: -len(RESULT_PREFIX)] if prompt.endswith(RESULT_PREFIX) else prompt
        return [
            (f"{CALL_PREFIX}{expression}{CALL_END}", True),
            (tool_result(expression), False),
            (answer, True),
        ]
