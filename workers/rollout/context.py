"""How long a run's sequences get: its longest prompt, as the model's tokenizer renders
it, plus `inference.max_new_tokens` (a multi-turn episode spends that budget on model
and tool tokens together, workers/rollout/episodes.py).

That, not the model's whole context, is what a sequence can ever hold: vLLM's
`max_model_len` and its KV cache are sized from it, and so is admission's estimate of
an inference worker's memory. A Qwen2.5-0.5B checkpoint takes 32,768 positions; a
reserve for 256 sequences that long is about 200 GB, for prompts of a hundred tokens.

The longest prompt is exact for a dataset (every row is rendered); for a task's
generator it is bounded from the longest prompt the task says it samples (characters)
and the most UTF-8 bytes a character of its prompts takes: a byte-level BPE or a
character tokenizer never makes more tokens than bytes.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from workers.rl_tasks import make_task, task_lengths
from workers.rollout.episodes import task_tools
from workers.rollout.task_data import load_splits

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig
    from workers.model.tokenizer import Tokenizer

# Prompts of a generator task rendered to find the bytes one of its characters takes.
_SAMPLED_PROMPTS = 64


def longest_prompt_tokens(cfg: RunConfig, tokenizer: Tokenizer) -> int | None:
    """The most tokens a prompt of the run renders to (chat template and BOS included),
    or None for a generator task that does not say how long its prompts get."""
    if cfg.task.dataset is not None:
        splits = load_splits(cfg)
        return max(len(tokenizer.prompt_ids(p)) for p, _ in splits.train + splits.eval)

    lengths = task_lengths(cfg.task)
    if lengths is None:
        return None
    task = make_task(cfg.task)
    tools = task_tools(task, tokenizer)  # a tool's schema in the prompt counts too
    prompts = [p for p, _ in task.sample(_SAMPLED_PROMPTS, random.Random("context"))]
    bytes_per_char = max((len(p.encode()) / len(p) for p in prompts if p), default=1.0)
    frame = len(tokenizer.prompt_ids("", tools))  # BOS, chat template, the task's own suffix
    sampled = max((len(tokenizer.prompt_ids(p, tools)) for p in prompts), default=0)
    return max(sampled, frame + int(lengths.prompt * bytes_per_char + 0.999))


def context_tokens(cfg: RunConfig, tokenizer: Tokenizer, positions: int | None) -> int:
    """Tokens one sequence of the run needs: the longest prompt + inference.max_new_tokens;
    the model's `positions` where a task does not say how long its prompts get.
    ValueError (naming inference.max_new_tokens) when that does not fit in `positions`."""
    prompt = longest_prompt_tokens(cfg, tokenizer)
    if prompt is None:
        if positions is None:
            raise ValueError(
                f"task {cfg.task.name!r} does not say how long its prompts get and the model has no position "
                "limit: give the task a lengths() classmethod, or its prompts as a task.dataset"
            )
        return positions
    need = prompt + cfg.inference.max_new_tokens
    if positions is not None and need > positions:
        raise ValueError(
            f"the longest prompt ({prompt} tokens) + inference.max_new_tokens ({cfg.inference.max_new_tokens}) "
            f"is {need} tokens; the model takes {positions} positions (max_position_embeddings): lower "
            f"inference.max_new_tokens to ≤ {max(positions - prompt, 0)} or use shorter prompts"
        )
    return need
