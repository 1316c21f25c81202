"""Tools a multi-turn task's environment runs for the model: a safe, exact calculator.

`calculate(expression)` evaluates + - * / with parentheses and unary signs over whole
numbers and decimals, exactly (fractions.Fraction), and returns text: the value ("84",
"-3", "7/2") or a message starting "error:" saying what was wrong. It never raises: a
tool is fed whatever the model wrote, and a bad call must come back as the tool's
answer, not end the rollout.

Written on the standard library's `ast` rather than a library such as simpleeval or
asteval: those evaluate in Python floats (1/3 is inexact) and allow far more than
arithmetic; here every node type is allowed by name and every value is bounded.
Nothing is ever passed to eval.

Every message is lowercase letters, digits and ", . : -" so that the char tokenizer
(workers/core/char_vocab.py DEFAULT_CHARS) can encode it.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_INPUT_CHARS = 64
MAX_LITERAL_DIGITS = 12
# A value (numerator or denominator) above this many digits is refused: multiplication
# can grow numbers fast, and a tool output must stay a few tokens long.
MAX_VALUE_DIGITS = 24

# What a call may contain before it is parsed: no letters, so no names, calls,
# attributes, hex/exponent literals or keywords can reach the parser's output.
_ALLOWED = re.compile(r"[0-9+\-*/(). ]*")
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class CalculatorError(Exception):
    """A refused expression; its message is what the tool answers."""


def calculate(expression: str) -> str:
    """The value of `expression` as text ("84", "-3", "7/2"), or "error: ..." saying why not."""
    try:
        return format_value(evaluate(expression))
    except CalculatorError as exc:
        return f"error: {exc}"


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; CalculatorError with a short reason if refused."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_INPUT_CHARS:
        raise CalculatorError(f"expression longer than {MAX_INPUT_CHARS} characters")
    if not _ALLOWED.fullmatch(text):
        raise CalculatorError("use only digits, + - * / and parentheses")
    if "**" in text or "//" in text:
        raise CalculatorError("only + - * / are supported")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("not a valid expression") from None
    return _value(tree.body, text)


def format_value(value: Fraction) -> str:
    """ "84", "-3", "7/2": an integer where the value is one, else the reduced fraction."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def _value(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        # The literal's own text, so "0.1" is exactly 1/10 (the float 0.1 is not).
        literal = ast.get_source_segment(source, node) or ""
        if sum(c.isdigit() for c in literal) > MAX_LITERAL_DIGITS:
            raise CalculatorError(f"numbers are limited to {MAX_LITERAL_DIGITS} digits")
        try:
            return _bounded(Fraction(literal))
        except ValueError:
            raise CalculatorError("not a valid number") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _value(node.operand, source)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, source), _value(node.right, source)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _bounded(_OPERATORS[type(node.op)](left, right))
    raise CalculatorError("only + - * / are supported")


def _bounded(value: Fraction) -> Fraction:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_VALUE_DIGITS:
        raise CalculatorError(f"result too large, over {MAX_VALUE_DIGITS} digits")
    return value
