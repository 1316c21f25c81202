"""Turn prompts into scored groups: run a backend, decode, reward, fill the data contract.

One path for every run config (`generate`): encode, generate (one backend call, one
decode step at a time where weights may arrive or a reward stage streams, or episodes),
score. The update mode is read once into an `UpdatePolicy`
(workers/rollout/partial_rollouts.py) that generation asks at its decision points.
A multi-turn task (`multi_turn = True`, e.g. workers/rl_tasks/tool_task.py) gets episodes instead
of single completions (workers/rollout/episodes.py); the rest is the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.config.run_config import RunConfig
from workers.core.records import Group, Rollout, group_id
from workers.core.sampling_mask import SamplingMask
from workers.inference.base import InferenceBackend
from workers.model.tokenizer import Tokenizer
from workers.rl_tasks import Task
from workers.rl_tasks.reward_funcs import Scores, score_group
from workers.rollout.episodes import Episode, episode_text, is_multi_turn, run_episodes, task_tools
from workers.rollout.partial_rollouts import (
    DRAIN,
    Generation,
    PartialCounts,
    PartialSequence,
    UpdatePolicy,
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


@dataclass
class Generated:
    """What `generate` returns: one scored group per prompt, the version the backend
    holds at the end, and the call's partial-rollout counts."""

    groups: list[Group]
    version: int
    counts: PartialCounts


def generate(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
    policy: UpdatePolicy = DRAIN,
    staged: WeightUpdates | None = None,
    rewards: RewardPool | None = None,
) -> Generated:
    """One group of `trainer.group_size` scored rollouts per (prompt, answer) pair: the
    rollout path of every run config.

    `policy` (the run's `sync.update_mode`, `UpdatePolicy.of`): under drain the call runs
    on the weights it started with (weights staged meanwhile wait for the next call);
    a stepped mode takes them from `staged` between two decode steps as it says, each
    token tagged with the version that produced it. `rewards`: the run's reward pool
    (workers/rollout/reward_stage.py): scoring after generation, or pipelined, chunk
    by chunk while it runs (one decode step at a time then, also under drain); None:
    scored here with the task's verifier. A multi-turn task gets episodes
    (workers/rollout/episodes.py) in place of single completions.

    Group ids are `"<seed>-<index>"`, unique as long as callers never reuse a seed.
    """
    n = cfg.trainer.group_size
    prompt_ids = [encode_prompt(tokenizer, p, task) for p, _ in prompts]
    stream = rewards.stream(prompts, n, tokenizer.decode) if rewards is not None and rewards.pipelined else None
    gen: Generation
    if is_multi_turn(task):
        if stream is not None:  # the run config refuses it (RunConfig._pipelined_rewards_fit_task)
            raise ValueError("rewards.mode 'pipelined' streams single completions; a multi-turn task has episodes")
        gen = run_episodes(
            backend,
            task,
            tokenizer,
            prompt_ids,
            n,
            cfg.inference.max_new_tokens,
            cfg.inference.temperature,
            seed,
            version,
            policy,
            staged,
        )
    elif policy.stepped or stream is not None:
        gen = generate_across_updates(
            backend,
            prompt_ids,
            n,
            cfg.inference.max_new_tokens,
            cfg.inference.temperature,
            seed,
            version,
            policy,
            staged,
            on_step=stream.on_step if stream is not None else None,
        )
    else:  # one call on one version: the backend's own batch generate
        gen = _one_call(backend, prompt_ids, n, cfg, seed, version)
    scorer: BatchScorer | None = None
    if stream is not None:
        scores = stream.scores([s for group in gen.sequences for s in group])
        scorer = lambda *_: scores  # noqa: E731
    elif rewards is not None:
        scorer = rewards.score_after
    groups = score_sequences(task, tokenizer, prompts, gen.sequences, seed, scorer)
    if stream is not None and cfg.rewards.credit == "process":
        # The steps go with the rollouts only where the trainer reads them: an outcome
        # run's buffer and checkpoints stay as they were.
        steps = iter(zip(stream.step_ends, stream.step_scores, strict=True))  # prompt-major, as the groups
        for g in groups:
            g.rollouts = [
                dataclasses.replace(r, step_ends=e, step_scores=v) for r, (e, v) in zip(g.rollouts, steps, strict=False)
            ]
    return Generated(groups, gen.version, gen.counts)


def generate_groups(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    cfg: RunConfig,
    version: int,
    seed: int,
) -> list[Group]:
    """`generate`'s groups under drain, scored here: one version throughout."""
    return generate(backend, task, tokenizer, prompts, cfg, version, seed).groups


def _one_call(
    backend: InferenceBackend, prompt_ids: list[list[int]], n: int, cfg: RunConfig, seed: int, version: int
) -> Generation:
    """Every completion in one `backend.generate` call: each token tagged with the
    version the backend stamped it with (`Completion.versions`, vLLM), else `version`."""
    completions = backend.generate(
        prompt_ids,
        n=n,
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
    return Generation(sequences, version, PartialCounts())


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
        gid = group_id(seed, i)
        rollouts = [
            Rollout(
                prompt_ids=list(s.prompt_ids),
                completion_ids=list(s.token_ids),
                behaviour_logprobs=list(s.logprobs),
                token_versions=list(s.versions),
                finish_reason=s.finish_reason or "length",
                reward=reward,
                group_id=gid,
                loss_mask=list(s.loss_mask) if isinstance(s, Episode) else None,
                expert_routing=s.routing,
                sampling_mask=SamplingMask.of(s.kept),
                reward_parts=parts,
            )
            for s, reward, parts in zip(seqs, scores.totals, scores.parts, strict=True)
        ]
        groups.append(Group(group_id=gid, prompt=prompt, answer=answer, rollouts=rollouts))
    return groups
