"""Checking a math answer: the final number of a completion against a reference's.

The final answer is what follows the last `####` (GSM8K's marker), else the last number
in the text. Numbers are normalised before they are compared: thousands commas
(`1,234`), a leading sign (`-3`, `+3`, the Unicode minus), decimals (`0.50`, `.5`), a
simple fraction (`3/4`), a trailing full stop or a `$`; they are compared exactly as
fractions, so `0.5`, `1/2` and `.50` are the same answer. Nothing is evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction

MARKER = "####"
# Past this a completion is not read: the regex below stays linear, but a reward
# computed on megabytes of text is a waste either way.
MAX_TEXT_CHARS = 10_000
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"  # 1,234,567 or 1234567
# A sign counts only where it cannot be an operator: "10-3" ends with 3, not -3.
NUMBER = re.compile(rf"(?:(?<![\w).])[-+])?(?:{_INT}(?:\.\d+)?|\.\d+)(?:/{_INT})?")


def parse_number(text: str) -> Fraction | None:
    """The value of one number as written (`"1,234.5"`, `"-3/4"`, `"$12."`); None if
    `text` is not exactly one number."""
    text = text.strip().replace("\u2212", "-").removeprefix("$").rstrip(".")
    if text.startswith(("-$", "+$")):
        text = text[0] + text[2:]
    if not NUMBER.fullmatch(text):
        return None
    numerator, _, denominator = text.replace(",", "").partition("/")
    try:
        value = Fraction(numerator)
        return value / Fraction(denominator) if denominator else value
    except (ValueError, ZeroDivisionError):
        return None


def final_answer(text: str) -> Fraction | None:
    """The value of the final answer in `text`: the first number after the last `####`
    (None if nothing numeric follows it), else the last number in the text."""
    text = text[:MAX_TEXT_CHARS].replace("\u2212", "-").replace("$", "")
    if MARKER in text:
        found = NUMBER.search(text.rsplit(MARKER, 1)[1])
        return parse_number(found.group()) if found else None
    numbers = NUMBER.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def same_answer(completion: str, reference: str) -> bool:
    """Whether `completion`'s final answer equals `reference`'s (both must have one)."""
    want = final_answer(reference)
    return want is not None and final_answer(completion) == want
