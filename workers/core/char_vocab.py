"""The characters of the tiny model's tokenizer (workers/model/tokenizer.py CharTokenizer),
in the order that fixes their ids. They live in the core tier because the config checks
`task.alphabet` against them and task data is checked against them, neither of which
may import the model tier.
"""

from __future__ import annotations

# The characters every tiny model has, in the ids they always had: reordering breaks
# every cached model, so never reorder.
BASE_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789=+-*/ ,.:?"
# Characters only some tasks use ("()" countdown's parentheses, "#" GSM8K's "#### answer"
# marker), appended only for a task that asks (`tiny_chars`): a tiny model whose task
# does not use them keeps the vocabulary, and so the initial weights, it always had. (With
# them always in, the default reverse run's initial weights changed, and with them its
# warm start: RL then stalled at reward 0.5 where it had reached 0.8 in 15 steps.)
EXTRA_CHARS = "()#"
# Every character some task may use.
DEFAULT_CHARS = BASE_CHARS + EXTRA_CHARS


def tiny_chars(extra: str = "") -> str:
    """The tiny model's characters for a task that uses `extra` beyond BASE_CHARS."""
    return BASE_CHARS + "".join(c for c in EXTRA_CHARS if c in extra)
