"""The periodic eval pass: the current policy on held-out prompts, scored as pass@k.

Held-out prompts (`eval_prompts`): the dataset's eval split (its first
`eval.num_prompts` rows, already shuffled by the run's seed) when the task reads a
dataset. For a generator task, a share of everything it can emit is reserved for
evaluation: the problems whose *key* hashes into one of `HELD_OUT_BUCKETS` buckets
(`is_held_out`). The key is the task's `problem_key(prompt, answer)` where it has one
(countdown: the numbers as a multiset and the target, so "3 5:8" and "5 3:8" are one
problem; gsm8k: the arithmetic, whatever the names and items around it), else the
prompt. The eval set is `eval.num_prompts` distinct problems drawn from the reserved
share with an rng seeded by the run's seed alone, so every inference worker computes the
same set; training and the warm start draw through `WithoutHeldOut`, which never yields
a reserved problem. The reserved share does not depend on the seed or on
`eval.num_prompts`, so no run with eval on, of any seed, ever trains on a problem that
any run evaluates on.

Each pass samples `eval.k` completions per prompt at `eval.temperature` through the same
backend, tokenizer and prompt encoding as training (workers.rollout.generation.encode_prompt;
a multi-turn task's episodes through workers.rollout.episodes.run_episodes), always with the
same sampling seed, so two passes differ by their weights, not by their dice.

Metrics, over all prompts: `eval/reward_mean`, the mean reward of every completion;
`eval/pass@1` and `eval/pass@k`, the unbiased estimator of Chen et al. (2021) per
prompt, averaged. A completion is *correct* when its reward is full (≥ 1 − 1e-9): a
task's partial credit (countdown's well-formed miss, reverse's prefix reward) counts in
the reward mean but never as a pass.

When (`is_due`): inference worker 0 runs a pass as soon as it holds weights that have
crossed a multiple of `eval.every_steps` since its last pass, and once more at the end
of the run on the final weights. The pass is labelled with the version it ran on.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import TYPE_CHECKING

from workers.rl_tasks.reward_funcs import score_group
from workers.rollout.episodes import Episode, episode_text, is_multi_turn, run_episodes
from workers.rollout.generation import encode_prompt
from workers.rollout.task_data import DatasetError, load_splits

if TYPE_CHECKING:
    from workers.config.run_config import EvalConfig, RunConfig
    from workers.inference.base import InferenceBackend
    from workers.model.tokenizer import Tokenizer
    from workers.rl_tasks import Task

# A reward at least this is a full answer: pass@k counts these.
CORRECT = 1.0 - 1e-9
REWARD_MEAN, PASS_AT_1, PASS_AT_K = "eval/reward_mean", "eval/pass@1", "eval/pass@k"
SERIES = (REWARD_MEAN, PASS_AT_1, PASS_AT_K)
# One bucket in this many of a generator task's problems is reserved for evaluation:
# more → more distinct problems to evaluate on; fewer → more left to train on.
HELD_OUT_BUCKETS = 8
# Draws per wanted prompt before a generator is judged unable to give enough distinct
# (or non-held-out) prompts: far above what any task with room for them needs, the
# reserved share's 1 in HELD_OUT_BUCKETS included.
DRAWS_PER_PROMPT = 100


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `c` are correct: the
    probability that `k` of the `n`, drawn without replacement, include a correct one,
    1 − C(n−c, k) / C(n, k)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 ≤ k ≤ n (got k={k}, n={n})")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n (got c={c}, n={n})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(rewards: list[list[float]], k: int) -> dict[str, float]:
    """The pass's series from each prompt's completion rewards (k or more each)."""
    if not rewards or any(len(r) < k for r in rewards):
        raise ValueError(f"every prompt needs at least k={k} rewards")
    corrects = [sum(r >= CORRECT for r in rs) for rs in rewards]
    return {
        REWARD_MEAN: sum(map(sum, rewards)) / sum(map(len, rewards)),
        PASS_AT_1: sum(pass_at_k(len(rs), c, 1) for rs, c in zip(rewards, corrects, strict=True)) / len(rewards),
        PASS_AT_K: sum(pass_at_k(len(rs), c, k) for rs, c in zip(rewards, corrects, strict=True)) / len(rewards),
    }


def is_due(version: int, last: int, every_steps: int) -> bool:
    """Whether weights at `version` have crossed a multiple of `every_steps` since the
    pass at `last` (0 before any): a version skipped on the way (two arrived at once)
    moves the pass to the next one, never drops it."""
    return every_steps > 0 and version // every_steps > last // every_steps


def problem_key(task: Task, prompt: str, answer: str) -> str:
    """What makes two of the task's problems the same one: its `problem_key` where it
    has one, else the prompt."""
    key = getattr(task, "problem_key", None)
    return key(prompt, answer) if key is not None else prompt


def is_held_out(key: str) -> bool:
    """Whether the problem with this key lies in the share reserved for evaluation.
    sha256, not `hash()`: the same answer in every process, whatever PYTHONHASHSEED."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % HELD_OUT_BUCKETS == 0


def held_out_prompts(task: Task, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (prompt, answer) pairs of distinct problems from the task's reserved share,
    the same for every caller with this seed."""
    rng = random.Random(f"{seed}-eval-prompts")
    found: dict[str, tuple[str, str]] = {}
    for _ in range(n * DRAWS_PER_PROMPT):
        ((prompt, answer),) = task.sample(1, rng)
        key = problem_key(task, prompt, answer)
        if is_held_out(key):
            found.setdefault(key, (prompt, answer))
            if len(found) == n:
                return list(found.values())
    raise ValueError(
        f"eval.num_prompts ({n}): the task's generator gave only {len(found)} distinct held-out problems in "
        f"{n * DRAWS_PER_PROMPT} draws (1 in {HELD_OUT_BUCKETS} of its problems is held out); lower "
        "eval.num_prompts or widen the task"
    )


def eval_prompts(cfg: RunConfig, task: Task) -> list[tuple[str, str]]:
    """The held-out (prompt, answer) pairs every pass of this run evaluates."""
    if cfg.task.dataset is not None:
        held = load_splits(cfg).eval[: cfg.eval.num_prompts]
        if not held:
            raise DatasetError(
                "task.dataset.eval_fraction",
                "holds out no rows to evaluate on (eval.every_steps > 0); raise it or give task.dataset.eval_path",
            )
        return held
    return held_out_prompts(task, cfg.eval.num_prompts, cfg.seed)


class WithoutHeldOut:
    """A prompt source (`sample(n, rng)`) that never yields a problem of `task`'s
    reserved share (`is_held_out`): each one drawn is replaced by a fresh draw."""

    def __init__(self, source, task: Task) -> None:
        self.source = source
        self.task = task

    def _trainable(self, pair: tuple[str, str]) -> bool:
        return not is_held_out(problem_key(self.task, *pair))

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for _ in range(max(n, 1) * DRAWS_PER_PROMPT):
            if len(out) == n:
                break
            out.extend(pair for pair in self.source.sample(n - len(out), rng) if self._trainable(pair))
        if len(out) < n:
            raise ValueError(
                "the task's generator yields almost only held-out prompts; lower eval.num_prompts or widen the task"
            )
        return out


def training_prompts(cfg: RunConfig, task: Task, source):
    """`source` (what training draws from) kept clear of the reserved share: a
    generator task's with eval on; a dataset's train split is already disjoint."""
    if cfg.eval.every_steps == 0 or cfg.task.dataset is not None:
        return source
    return WithoutHeldOut(source, task)


def evaluate(
    backend: InferenceBackend,
    task: Task,
    tokenizer: Tokenizer,
    prompts: list[tuple[str, str]],
    eval_cfg: EvalConfig,
    max_new_tokens: int,
    seed: int,
) -> dict[str, float]:
    """One pass with the weights the backend holds: `eval_cfg.k` completions per prompt,
    scored by the task's reward; returns `eval_metrics`."""
    prompt_ids = [encode_prompt(tokenizer, p, task) for p, _ in prompts]
    k, temperature = eval_cfg.k, eval_cfg.temperature
    if is_multi_turn(task):
        episodes = run_episodes(backend, task, tokenizer, prompt_ids, k, max_new_tokens, temperature, seed, 0)
        token_ids = [[list(s.token_ids) for s in seqs] for seqs in episodes.sequences]
        texts = [
            [episode_text(tokenizer, s.token_ids, s.loss_mask) for s in seqs if isinstance(s, Episode)]
            for seqs in episodes.sequences
        ]
    else:
        completions = backend.generate(prompt_ids, k, max_new_tokens, temperature, seed)
        token_ids = [[list(c.token_ids) for c in comps] for comps in completions]
        texts = [[tokenizer.decode(ids) for ids in per_prompt] for per_prompt in token_ids]

    rewards = [
        score_group(task, prompt, answer, group_texts, per_prompt).totals
        for (prompt, answer), group_texts, per_prompt in zip(prompts, texts, token_ids, strict=True)
    ]
    return eval_metrics(rewards, k)
