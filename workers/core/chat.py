"""Conversational prompts (TRL's conversational format): a list of {"role", "content"}
messages, rendered by the model's chat template.

A prompt travels through the engine as text (the buffer, checkpoints and the episode
log all hold text), so a conversational prompt travels as its messages' JSON, written
by `encode` alone; `messages_of` reads it back, and returns None for a plain-text prompt.
Only a prompt that starts exactly as `encode` writes one (`[{"role": "`) and parses as
such a list is taken for messages.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
_START = '[{"role": '


def is_messages(value: Any) -> bool:
    """Whether `value` is a conversational prompt: a non-empty list of messages, each a
    mapping with a string `role` and a string `content`."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )


def encode(messages: list[dict[str, Any]]) -> str:
    """The prompt text that carries `messages` (their role and content only)."""
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], ensure_ascii=False)


def messages_of(prompt: str) -> list[dict[str, str]] | None:
    """The messages a prompt written by `encode` carries; None for a plain-text prompt."""
    if not prompt.startswith(_START):
        return None
    try:
        value = json.loads(prompt)
    except ValueError:
        return None
    return value if is_messages(value) else None
