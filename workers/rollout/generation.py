"""Turn prompts into scored groups: run a backend, decode, reward, fill the data contract.

A multi-turn task (`multi_turn = True`, e.g. workers/rl_tasks/tool_task.py) gets episodes instead
of single completions (workers/rollout/episodes.py); the rest is the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from workers.config.run_config import RunConfig
from workers.core.records import Group, Rollout
from workers.core.sampling_mask import SamplingMask
from workers.inference.base import InferenceBackend
from workers.model.tokenizer import Tokenizer
from workers.rl_tasks import Task
from workers.rl_tasks.reward_funcs import Scores, score_group
from workers.rollout.episodes import Episode, episode_text, is_multi_turn, run_episodes, task_tools
from workers.rollout.partial_rollouts import (
    STEPPED_MODES,
    NoUpdates,
    PartialCounts,
    PartialSequence,
    WeightUpdates,
    generate_across_updates,
)

if TYPE_CHECKING:
    from workers.rollout.reward_stage import RewardPool

# Scores a batch: (prompt, answer) per group, each group's texts and token ids → its Scores.
BatchScorer = Callable[[Sequence[tuple[str, str]], list[list[str]], list[list[list[int]]]], list[Scores]]


def encode_prompt(tokenizer: Tokenizer, prompt: str, task: object = None) -> list[int]:
    """Model input for a prompt (the trainer uses the same ids): BOS then its characters
    for the char tokenizer; a Hugging Face tokenizer's chat template where the model has
    one (workers.model.tokenizer.HFTokenizer.prompt_ids), with the tools of `task` where the
    template renders them (workers.rollout.episodes.task_tools)."""
    return tokenizer.prompt_ids(prompt, task_tools(task, tokenizer))


def generate_groups(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    scorer: BatchScorer | None = None,
) -> list[Group]:
    """One group of `trainer.group_size` scored rollouts per (prompt, answer) pair, in one
    generate call (update mode drain): every token is tagged with the version the backend
    stamped it with (`Completion.versions`, vLLM), else with `version`. A multi-turn
    task's episodes run on those same weights, every turn.

    Group ids are `"<seed>-<index>"`, unique as long as callers never reuse a seed.
    `scorer`: where the groups are scored (the reward pool, `after`); None: here, with
    the task's verifier.
    """
    prompt_ids = [encode_prompt(tokenizer, p, task) for p, _ in prompts]
    if is_multi_turn(task):
        gen = _episodes(backend, task, tokenizer, prompt_ids, cfg, seed, version)
        return score_sequences(task, tokenizer, prompts, gen.sequences, seed, scorer)
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
                c.versions or [version] * len(c.token_ids),
                c.finish_reason,
                c.routing,
                list(c.kept),
            )
            for c in comps
        ]
        for ids, comps in zip(prompt_ids, completions, strict=True)
    ]
    return score_sequences(task, tokenizer, prompts, sequences, seed, scorer)


def generate_groups_across_updates(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    updates: WeightUpdates,
    scorer: BatchScorer | None = None,
) -> tuple[list[Group], int, PartialCounts]:
    """`generate_groups` for the stepped update modes (abort_retry, abort_resume,
    in_flight: workers/rollout/partial_rollouts.py): weights staged while the call runs are taken as
    `sync.update_mode` says, and each token is tagged with the version that produced it.
    Returns the groups, the version loaded at the end, and the partial-rollout counts."""
    prompt_ids = [encode_prompt(tokenizer, p, task) for p, _ in prompts]
    if is_multi_turn(task):
        gen = _episodes(backend, task, tokenizer, prompt_ids, cfg, seed, version, updates)
        return score_sequences(task, tokenizer, prompts, gen.sequences, seed, scorer), gen.version, gen.counts
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
    return score_sequences(task, tokenizer, prompts, gen.sequences, seed, scorer), gen.version, gen.counts


def generate_groups_in_mode(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    staged: WeightUpdates,
    rewards: RewardPool | None = None,
) -> tuple[list[Group], PartialCounts]:
    """An inference worker's generate call under `sync.update_mode`: in drain,
    `generate_groups` (weights staged meanwhile wait for the next call); in a stepped
    mode, `generate_groups_across_updates` taking them from `staged`. Returns the groups
    and the call's partial-rollout counts. `rewards`: the run's reward pool
    (workers/rollout/reward_stage.py), None where the groups are scored here."""
    if rewards is not None and rewards.pipelined:
        return _generate_pipelined(backend, task, tokenizer, prompts, cfg, version, seed, staged, rewards)
    scorer = rewards.score_after if rewards is not None else None
    if cfg.sync.update_mode not in STEPPED_MODES:
        return generate_groups(backend, task, tokenizer, prompts, cfg, version, seed, scorer), PartialCounts()
    groups, _, counts = generate_groups_across_updates(
        backend, task, tokenizer, prompts, cfg, version, seed, staged, scorer
    )
    return groups, counts


def _generate_pipelined(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    staged: WeightUpdates,
    rewards: RewardPool,
) -> tuple[list[Group], PartialCounts]:
    """Generate one decode step at a time, streaming each completion's chunks to the
    reward pool as it grows (rewards.mode 'pipelined'). Under drain no weights are taken
    mid-call, exactly as `generate_groups`."""
    prompt_ids = [encode_prompt(tokenizer, p, task) for p, _ in prompts]
    stepped = cfg.sync.update_mode in STEPPED_MODES
    n = cfg.trainer.group_size
    stream = rewards.stream(prompts, n, tokenizer.decode)
    gen = generate_across_updates(
        backend,
        prompt_ids,
        n,
        cfg.inference.max_new_tokens,
        cfg.inference.temperature,
        seed,
        version,
        cfg.sync.update_mode if stepped else "in_flight",
        staged if stepped else NoUpdates(),
        on_step=stream.on_step,
    )
    flat = [s for group in gen.sequences for s in group]
    scores = stream.scores(flat)
    groups = score_sequences(task, tokenizer, prompts, gen.sequences, seed, lambda *_: scores)
    if cfg.rewards.credit == "process":
        # The steps go with the rollouts only where the trainer reads them: an outcome
        # run's buffer and checkpoints stay as they were.
        steps = iter(zip(stream.step_ends, stream.step_scores, strict=True))  # prompt-major, as the groups
        for g in groups:
            g.rollouts = [
                dataclasses.replace(r, step_ends=e, step_scores=v) for r, (e, v) in zip(g.rollouts, steps, strict=False)
            ]
    return groups, gen.counts


def _episodes(backend, task, tokenizer, prompt_ids, cfg: RunConfig, seed: int, version: int, updates=None):
    """A multi-turn task's episodes with the run's batch shape: on one version without
    `updates`, else taking staged weights as `sync.update_mode` says."""
    mode = cfg.sync.update_mode if updates is not None else "drain"
    return run_episodes(
        backend, task, tokenizer, prompt_ids, cfg.trainer.group_size, cfg.inference.max_new_tokens,
        cfg.inference.temperature, seed, version, mode, updates,
    )  # fmt: skip


def score_sequences(
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    sequences: Sequence[Sequence[PartialSequence]],
    seed: int,
    scorer: BatchScorer | None = None,
) -> list[Group]:
    """One scored group per (prompt, answer) and its sequences (completions or
    episodes), ids `"<seed>-<index>"`: the task's verifier (or its reward functions), or
    `scorer` where one is given."""
    texts = [
        [
            episode_text(tokenizer, s.token_ids, s.loss_mask)
            if isinstance(s, Episode)
            else tokenizer.decode(s.token_ids)
            for s in seqs
        ]
        for seqs in sequences
    ]
    ids = [[list(s.token_ids) for s in seqs] for seqs in sequences]
    if scorer is None:
        batch = [score_group(task, p, a, t, i) for (p, a), t, i in zip(prompts, texts, ids, strict=True)]
    else:
        batch = scorer(prompts, texts, ids)
    groups = []
    for i, ((prompt, answer), seqs, scores) in enumerate(zip(prompts, sequences, batch, strict=True)):
        group_id = f"{seed}-{i}"
        rollouts = [
            Rollout(
                prompt_ids=list(s.prompt_ids),
                completion_ids=list(s.token_ids),
                behaviour_logprobs=list(s.logprobs),
                token_versions=list(s.versions),
                finish_reason=s.finish_reason or "length",
                reward=reward,
                group_id=group_id,
                loss_mask=list(s.loss_mask) if isinstance(s, Episode) else None,
                expert_routing=s.routing,
                sampling_mask=SamplingMask.of(s.kept),
                reward_parts=parts,
            )
            for s, reward, parts in zip(seqs, scores.totals, scores.parts, strict=True)
        ]
        groups.append(Group(group_id=group_id, prompt=prompt, answer=answer, rollouts=rollouts))
    return groups
