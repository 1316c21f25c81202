"""Turn prompts into scored groups: run a backend, decode, reward, fill the data contract.

A multi-turn task (`multi_turn = True`, e.g. workers/tool_task.py) gets episodes instead
of single completions (workers/episodes.py); the rest is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.config import RunConfig
from workers.episodes import Episode, is_multi_turn, run_episodes
from workers.inference.base import InferenceBackend
from workers.partial_rollouts import (
    STEPPED_MODES,
    PartialCounts,
    PartialSequence,
    WeightUpdates,
    generate_across_updates,
)
from workers.rl_tasks import Task
from workers.rollout import Group, Rollout
from workers.sampling_mask import SamplingMask
from workers.tokenizer import Tokenizer


def encode_prompt(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Model input for a prompt (the trainer uses the same ids): BOS then its characters
    for the char tokenizer; a Hugging Face tokenizer's chat template where the model has
    one (workers.tokenizer.HFTokenizer.prompt_ids)."""
    return tokenizer.prompt_ids(prompt)


def generate_groups(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
) -> list[Group]:
    """One group of `trainer.group_size` scored rollouts per (prompt, answer) pair, in one
    generate call (update mode drain): every token is tagged with `version`. A multi-turn
    task's episodes run on those same weights, every turn.

    Group ids are `"<seed>-<index>"`, unique as long as callers never reuse a seed.
    """
    prompt_ids = [encode_prompt(tokenizer, p) for p, _ in prompts]
    if is_multi_turn(task):
        gen = _episodes(backend, task, tokenizer, prompt_ids, cfg, seed, version)
        return _score(task, tokenizer, prompts, gen.sequences, seed)
    completions = backend.generate(
        prompt_ids,
        n=cfg.trainer.group_size,
        max_new_tokens=cfg.inference.max_new_tokens,
        temperature=cfg.inference.temperature,
        seed=seed,
    )
    sequences = [
        [
            PartialSequence(
                ids,
                list(c.token_ids),
                list(c.logprobs),
                [version] * len(c.token_ids),
                c.finish_reason,
                c.routing,
                list(c.kept),
            )
            for c in comps
        ]
        for ids, comps in zip(prompt_ids, completions, strict=True)
    ]
    return _score(task, tokenizer, prompts, sequences, seed)


def generate_groups_across_updates(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    updates: WeightUpdates,
) -> tuple[list[Group], int, PartialCounts]:
    """`generate_groups` for the stepped update modes (abort_retry, abort_resume,
    in_flight: workers/partial_rollouts.py): weights staged while the call runs are taken as
    `sync.update_mode` says, and each token is tagged with the version that produced it.
    Returns the groups, the version loaded at the end, and the partial-rollout counts."""
    prompt_ids = [encode_prompt(tokenizer, p) for p, _ in prompts]
    if is_multi_turn(task):
        gen = _episodes(backend, task, tokenizer, prompt_ids, cfg, seed, version, updates)
        return _score(task, tokenizer, prompts, gen.sequences, seed), gen.version, gen.counts
    gen = generate_across_updates(
        backend,
        prompt_ids,
        cfg.trainer.group_size,
        cfg.inference.max_new_tokens,
        cfg.inference.temperature,
        seed,
        version,
        cfg.sync.update_mode,
        updates,
    )
    return _score(task, tokenizer, prompts, gen.sequences, seed), gen.version, gen.counts


def generate_groups_in_mode(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    staged: WeightUpdates,
) -> tuple[list[Group], PartialCounts]:
    """An inference worker's generate call under `sync.update_mode`: in drain,
    `generate_groups` (weights staged meanwhile wait for the next call); in a stepped
    mode, `generate_groups_across_updates` taking them from `staged`. Returns the groups
    and the call's partial-rollout counts."""
    if cfg.sync.update_mode not in STEPPED_MODES:
        return generate_groups(backend, task, tokenizer, prompts, cfg, version, seed), PartialCounts()
    groups, _, counts = generate_groups_across_updates(backend, task, tokenizer, prompts, cfg, version, seed, staged)
    return groups, counts


def _episodes(backend, task, tokenizer, prompt_ids, cfg: RunConfig, seed: int, version: int, updates=None):
    """A multi-turn task's episodes with the run's batch shape: on one version without
    `updates`, else taking staged weights as `sync.update_mode` says."""
    mode = cfg.sync.update_mode if updates is not None else "drain"
    return run_episodes(
        backend, task, tokenizer, prompt_ids, cfg.trainer.group_size, cfg.inference.max_new_tokens,
        cfg.inference.temperature, seed, version, mode, updates,
    )  # fmt: skip


def _score(
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    sequences: Sequence[Sequence[PartialSequence]],
    seed: int,
) -> list[Group]:
    groups = []
    for i, ((prompt, answer), seqs) in enumerate(zip(prompts, sequences, strict=True)):
        group_id = f"{seed}-{i}"
        rollouts = [
            Rollout(
                prompt_ids=list(s.prompt_ids),
                completion_ids=list(s.token_ids),
                behaviour_logprobs=list(s.logprobs),
                token_versions=list(s.versions),
                finish_reason=s.finish_reason or "length",
                reward=task.reward(tokenizer.decode(s.token_ids), answer),
                group_id=group_id,
                loss_mask=list(s.loss_mask) if isinstance(s, Episode) else None,
                expert_routing=s.routing,
                sampling_mask=SamplingMask.of(s.kept),
            )
            for s in seqs
        ]
        groups.append(Group(group_id=group_id, prompt=prompt, answer=answer, rollouts=rollouts))
    return groups
