"""Turn prompts into scored groups: run a backend, decode, reward, fill the data contract."""

from __future__ import annotations

from workers.config import RunConfig
from workers.inference.base import InferenceBackend
from workers.rollout import Group, Rollout
from workers.tasks import Task
from workers.tokenizer import CharTokenizer


def encode_prompt(tokenizer: CharTokenizer, prompt: str) -> list[int]:
    """Model input for a prompt: BOS then its characters (the trainer uses the same ids)."""
    return [tokenizer.bos_id, *tokenizer.encode(prompt)]


def generate_groups(
    backend: InferenceBackend,
    task: Task,
    tokenizer: CharTokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
) -> list[Group]:
    """One group of `trainer.group_size` scored rollouts per (prompt, answer) pair.

    Every token is tagged with `version`: the whole call ran under one policy version.
    Group ids are `"<seed>-<index>"`, unique as long as callers never reuse a seed.
    """
    prompt_ids = [encode_prompt(tokenizer, p) for p, _ in prompts]
    completions = backend.generate(
        prompt_ids,
        n=cfg.trainer.group_size,
        max_new_tokens=cfg.inference.max_new_tokens,
        temperature=cfg.inference.temperature,
        seed=seed,
    )
    groups = []
    for i, ((prompt, answer), ids, comps) in enumerate(zip(prompts, prompt_ids, completions)):
        group_id = f"{seed}-{i}"
        rollouts = [
            Rollout(
                prompt_ids=list(ids),
                completion_ids=list(c.token_ids),
                behaviour_logprobs=list(c.logprobs),
                token_versions=[version] * len(c.token_ids),
                finish_reason=c.finish_reason,
                reward=task.reward(tokenizer.decode(c.token_ids), answer),
                group_id=group_id,
            )
            for c in comps
        ]
        groups.append(Group(group_id=group_id, prompt=prompt, answer=answer, rollouts=rollouts))
    return groups
