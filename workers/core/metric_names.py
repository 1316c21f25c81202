"""The metric vocabulary: one list, one spelling, read by the engine and the dashboard.

Every point the engine emits is (series, step, value, time). `step` is the trainer
step (== policy version) at the moment of emission, so every series shares one x-axis.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    help: str
    # Empty: every run emits the series. Otherwise the condition, in config terms, under
    # which a run emits it (tests/engine/test_metric_vocabulary.py checks each condition).
    only: str = ""
    # One series per trainer rank, named `<name>/<rank>` (rank_series).
    per_rank: bool = False


# The condition of the series only episodes on their own clocks emit
# (workers/rollout/episode_scheduler.py); agent/* need several agents as well.
MULTI_AGENT = "a multi-agent task (task.name propose_solve), or buffer.unit episode"

METRICS: tuple[Metric, ...] = (
    Metric("buffer/depth", "groups", "Groups waiting in the rollout buffer."),
    Metric(
        "buffer/capacity",
        "groups",
        "Buffer capacity.",
        only="buffer.mode other than unbounded (a stream has no capacity)",
    ),
    Metric("buffer/dropped_stale", "groups", "Groups dropped for exceeding max_staleness (cumulative)."),
    Metric(
        "buffer/requeued",
        "groups",
        "Stale groups whose prompts went back to be generated again (on_stale='requeue', cumulative).",
    ),
    Metric(
        "buffer/regenerated", "groups", "Requeued prompts generated again and trained (on_stale='requeue', cumulative)."
    ),
    Metric(
        "buffer/dropped_uniform",
        "groups",
        "Groups dropped because their rewards were all equal, replaced by fresh ones (dynamic sampling, cumulative).",
        only="trainer.dynamic_sampling",
    ),
    Metric("buffer/starved_s", "s", "Time the trainer waited on the buffer for fresh groups (cumulative)."),
    # The prompt ledger (workers/run/ledger.py): one point each, at the run's last step,
    # once its loops have stopped.
    Metric("ledger/drawn", "rows", "Rows the inference workers drew from the data or the task (fresh draws)."),
    Metric("ledger/trained", "groups", "Groups handed to the trainer."),
    Metric("ledger/dropped_stale", "groups", "Drawn rows whose groups were dropped as stale."),
    Metric("ledger/dropped_uniform", "groups", "Drawn rows whose groups were dropped with equal rewards."),
    Metric("ledger/waiting", "groups", "Groups left in the buffer when the run stopped."),
    Metric("ledger/requeued_waiting", "groups", "Stale groups left waiting to be generated again."),
    Metric("ledger/in_flight", "rows", "Rows being generated when the run stopped (abandoned)."),
    Metric(
        "ledger/unaccounted",
        "rows",
        "Rows drawn and in none of the places above: 0 unless a row was lost (or counted twice, negative).",
    ),
    # The run's schedule (workers/run/schedule.py): one point each, at the last step.
    Metric("schedule/bytes", "bytes", "The recorded schedule's size as compact JSON (what a replay needs)."),
    Metric("schedule/bytes_per_step", "bytes", "The recorded schedule's size per trainer step."),
    Metric(
        "staleness/mean", "versions", "Mean token staleness (trainer version − token version) of the trained batch."
    ),
    Metric("staleness/max", "versions", "Max token staleness of the trained batch."),
    Metric("sync/latency_ms", "ms", "End-to-end weight sync latency (trainer publish → inference loaded)."),
    Metric("sync/bytes", "bytes", "Bytes moved by one weight sync."),
    Metric("sync/trainer_ms", "ms", "Weight sync time on the trainer (how long the send blocked training)."),
    Metric("sync/inference_ms", "ms", "Weight sync time on the slowest inference worker (receive + load)."),
    Metric("inference/tokens_per_s", "tok/s", "Generated tokens per second, all inference workers."),
    Metric("inference/idle_frac", "fraction", "Fraction of wall time inference workers were not generating."),
    Metric("trainer/idle_frac", "fraction", "Fraction of wall time the trainer waited for data or weights."),
    Metric(
        "inference/asleep_frac",
        "fraction",
        "Fraction of wall time the inference workers' vLLM slept, its GPU handed to the colocated trainer rank.",
        only="inference.sleep_level ≥ 1",
    ),
    Metric(
        "reward/pool_busy_frac",
        "fraction",
        "Fraction of wall time the reward workers spent scoring, since the previous point.",
        only="rewards.workers ≥ 1",
    ),
    Metric(
        "reward/scoring_lag_ms",
        "ms",
        "Mean lag from a scored chunk's last generated token to its score (after: from the end of the generate "
        "call), since the previous point.",
        only="rewards.workers ≥ 1",
    ),
    Metric("trainer/step_s", "s", "Wall time of one training step."),
    # Model FLOPs (workers/train/mfu.py): 6·N_active + 12·L·d_attn·T per token of a T-token sequence.
    Metric(
        "trainer/tokens_per_s",
        "tok/s",
        "Tokens (prompt + completion) of the trained sequences per second of the training step, all ranks.",
    ),
    Metric(
        "trainer/model_tflops",
        "TFLOP/s",
        "The model's training FLOPs of the step's sequences per second, per trainer device (6·N_active + "
        "12·L·d_attn·T per token; recomputation and extra forwards not counted).",
    ),
    Metric(
        "trainer/mfu",
        "fraction",
        "Model FLOPs utilisation: trainer/model_tflops over the device's dense peak for trainer.dtype.",
        only="a trainer on a GPU in the table of peaks (workers/train/mfu.py), or ROLLWAY_PEAK_TFLOPS set",
    ),
    Metric(
        "trainer/grad_norm",
        "",
        "Gradient L2 norm before clipping to trainer.max_grad_norm (mean over the step's minibatches).",
    ),
    Metric("rollout/backpressure_s", "s", "Time producers were blocked on a full buffer since the last step."),
    Metric(
        "rollout/handoff_s",
        "s",
        "Time inference workers spent in their calls to the buffer (asking for admission, handing it rollouts; "
        "not blocked on a full buffer) since the last step.",
    ),
    Metric(
        "rollout/partial_aborted",
        "sequences",
        "Sequences aborted by a weight update (sync.update_mode abort_retry / abort_resume, cumulative).",
    ),
    Metric(
        "rollout/partial_resumed",
        "sequences",
        "Aborted sequences continued from their kept tokens under new weights (abort_resume, cumulative).",
    ),
    Metric(
        "rollout/partial_retried",
        "sequences",
        "Aborted sequences generated again from the prompt (abort_retry, cumulative).",
    ),
    Metric(
        "rollout/mixed_version_frac",
        "fraction",
        "Fraction of trained sequences whose tokens come from more than one policy version.",
    ),
    Metric(
        "buffer/late_groups",
        "groups",
        "Groups trained at least one version after the oldest of their tokens (cumulative): with "
        "buffer.overcommit, the late episodes that train a step after the batch they were admitted for.",
    ),
    # Episodes on their own clocks (workers/rollout/episode_scheduler.py), over the episodes that
    # ended since the previous point.
    Metric(
        "episode/p50_s",
        "s",
        "Median episode completion time (every agent's turn, first start to last environment answer).",
        only=MULTI_AGENT,
    ),
    Metric("episode/p90_s", "s", "90th-percentile episode completion time.", only=MULTI_AGENT),
    Metric(
        "episode/tail_ratio",
        "",
        "Episode p90 over p50 (how heavy the tail a step's barrier waits on is).",
        only=MULTI_AGENT,
    ),
    Metric("reward/mean", "reward", "Mean reward of the trained batch."),
    # The trained batch's spread and lengths (workers/train/batch_stats.py).
    Metric(
        "reward/std",
        "reward",
        "Standard deviation of the trained batch's rewards over its completions (Bessel-corrected, as TRL's).",
    ),
    Metric(
        "reward/zero_std_frac",
        "fraction",
        "Fraction of the trained batch's groups whose completions all got the same reward (zero advantage: "
        "no learning signal); with rewards.credit 'process', the same score at every step.",
    ),
    Metric("completion/length_mean", "tokens", "Mean completion length of the trained batch."),
    Metric("completion/length_min", "tokens", "Shortest completion of the trained batch."),
    Metric("completion/length_max", "tokens", "Longest completion of the trained batch."),
    Metric(
        "completion/clipped_frac",
        "fraction",
        "Fraction of the trained completions cut by the token budget or turn limit (no EOS).",
    ),
    Metric("trainer/lr", "", "The optimizer's learning rate at the step."),
    Metric("loss", "", "Policy loss."),
    Metric("is/ratio_mean", "", "Mean truncated-IS weight pi_old/mu."),
    Metric("is/clipped_frac", "fraction", "Fraction of tokens whose IS weight was truncated."),
    Metric(
        "ppo/clipped_frac",
        "fraction",
        "Fraction of tokens where the PPO clip (trainer.clip_eps) bound the objective.",
        only="correction.method other than pipelinerl_reinforce (it has no PPO clip)",
    ),
    Metric(
        "ppo/clipped_low_frac",
        "fraction",
        "Fraction of tokens clipped on the low side: ratio below 1 − trainer.clip_eps with a negative advantage.",
        only="correction.method other than pipelinerl_reinforce (it has no PPO clip)",
    ),
    Metric(
        "ppo/clipped_high_frac",
        "fraction",
        "Fraction of tokens clipped on the high side: ratio above 1 + trainer.clip_eps_high (else clip_eps) with a "
        "positive advantage.",
        only="correction.method other than pipelinerl_reinforce (it has no PPO clip)",
    ),
    Metric("mismatch/kl", "nats", "KL(behaviour || trainer) estimate on the trained tokens."),
    Metric(
        "routing/agreement",
        "fraction",
        "Share of token × MoE-layer selections where the trainer's own router picks the experts generation "
        "picked (the rest are replayed).",
        only="correction.keep_routing",
    ),
    Metric(
        "loss/kl_ref",
        "nats",
        "KL(policy || frozen reference) on the trained tokens, by trainer.kl_estimator (token mean): the "
        "penalty's size before trainer.kl_coef.",
        only="trainer.kl_coef > 0",
    ),
    Metric("policy/version", "", "Trainer policy version after the step."),
    Metric(
        "policy/entropy",
        "nats",
        "Mean per-token entropy of the policy (at the sampling temperature) on the trained completions.",
    ),
    Metric("samples/per_s", "samples/s", "Trained samples per second of wall time."),
    # A trainer pool's ranks (workers/train/trainer_pool.py), one series per rank.
    Metric(
        "trainer/rank_busy_frac",
        "fraction",
        "Fraction of the step's wall time the rank spent on its part of the step.",
        only="trainer.backend ddp or fsdp2",
        per_rank=True,
    ),
    Metric(
        "trainer/rank_compute_s",
        "s",
        "Seconds of the rank's part of the step with no collective in flight.",
        only="trainer.backend ddp or fsdp2",
        per_rank=True,
    ),
    Metric(
        "trainer/rank_comm_s",
        "s",
        "Seconds of the rank's part of the step with a collective in flight (gradient all-reduce; "
        "fsdp2's parameter all-gathers and gradient reduce-scatters).",
        only="trainer.backend ddp or fsdp2",
        per_rank=True,
    ),
    Metric(
        "trainer/rank_comm_bytes",
        "bytes",
        "Bytes the rank all-reduced, all-gathered or reduce-scattered since its previous step.",
        only="trainer.backend ddp or fsdp2",
        per_rank=True,
    ),
    # The eval pass (workers/rollout/evaluation.py): step = the policy version it ran on.
    Metric(
        "eval/pass@1",
        "fraction",
        "Held-out prompts: chance one sampled completion is correct (full reward), unbiased "
        "estimate from eval.k samples, mean over prompts.",
        only="eval.every_steps > 0",
    ),
    Metric(
        "eval/pass@k",
        "fraction",
        "Held-out prompts: chance at least one of eval.k sampled completions is correct (full reward), "
        "mean over prompts.",
        only="eval.every_steps > 0",
    ),
    Metric(
        "eval/reward_mean",
        "reward",
        "Held-out prompts: mean reward of all eval completions (partial credit included).",
        only="eval.every_steps > 0",
    ),
)

NAMES: frozenset[str] = frozenset(m.name for m in METRICS)
PER_RANK: frozenset[str] = frozenset(m.name for m in METRICS if m.per_rank)


def rank_series(name: str, rank: int) -> str:
    """The series of per-rank metric `name` for trainer rank `rank`."""
    if name not in PER_RANK:
        raise ValueError(f"{name!r} is not a per-rank metric ({sorted(PER_RANK)})")
    return f"{name}/{int(rank)}"


# One pair of series per task.reward_funcs function, `rewards/<function>/mean|std` (TRL's
# names; workers/rl_tasks/reward_funcs.py computes them).
REWARD_FUNC_PREFIX = "rewards/"
# Series names are at most 64 characters of [a-z0-9_./@-] (the site's SERIES_PATTERN):
# "rewards/" + name + "/mean" leaves 51 for the function's name.
REWARD_FUNC_NAME_MAX = 64 - len(REWARD_FUNC_PREFIX) - len("/mean")
_HASH_CHARS = 8
_SERIES_UNSAFE = re.compile(r"[^a-z0-9_.@-]")
REWARD_FUNC_STATS = {
    "mean": "Mean of one task.reward_funcs function's rewards over the trained batch (not-applicable ones left out).",
    "std": "Standard deviation of one task.reward_funcs function's rewards over the trained batch.",
}


# Per agent of a multi-agent task, `agent/<agent>/<stat>` (workers/rollout/episode_scheduler.py).
AGENT_PREFIX = "agent/"
AGENT_STATS = {
    "reward_mean": "Mean reward of one agent's turns in the trained batch (a multi-agent task's episodes).",
    "p50_s": "Median completion time of one agent's turns (queue, generation and its environment's answer).",
    "p90_s": "90th-percentile completion time of one agent's turns.",
}


def agent_series(agent: str, stat: str) -> str:
    """`agent/<agent>/<stat>`: one agent's series (stat one of AGENT_STATS)."""
    if stat not in AGENT_STATS:
        raise ValueError(f"{stat!r} is not an agent statistic ({sorted(AGENT_STATS)})")
    return f"{AGENT_PREFIX}{_SERIES_UNSAFE.sub('_', agent.lower())[:REWARD_FUNC_NAME_MAX]}/{stat}"


def is_agent_series(series: str) -> bool:
    """Whether `series` is one agent's, `agent/<agent>/<stat>`."""
    name, _, stat = series.rpartition("/")
    agent = name.removeprefix(AGENT_PREFIX)
    return name.startswith(AGENT_PREFIX) and bool(agent) and "/" not in agent and stat in AGENT_STATS


def metric_of(series: str) -> Metric | None:
    """The vocabulary's entry for a series name (a per-rank series by its metric, a
    reward function's by its statistic), or None."""
    name, _, rank = series.rpartition("/")
    if name in PER_RANK and rank.isdigit():
        return next(m for m in METRICS if m.name == name)
    if is_reward_func_series(series):
        return Metric(series, "reward", REWARD_FUNC_STATS[rank], only="task.reward_funcs")
    if is_agent_series(series):
        return Metric(series, "reward" if rank == "reward_mean" else "s", AGENT_STATS[rank], only=MULTI_AGENT)
    return next((m for m in METRICS if m.name == series and not m.per_rank), None)


def is_reward_func_series(series: str) -> bool:
    """Whether `series` is one of a reward function's, `rewards/<function>/mean|std`."""
    name, _, stat = series.rpartition("/")
    func = name.removeprefix(REWARD_FUNC_PREFIX)
    return name.startswith(REWARD_FUNC_PREFIX) and bool(func) and "/" not in func and stat in REWARD_FUNC_STATS


# The charts on a run page: (title, series shown together).
DASHBOARD_CHARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("reward/mean",)),
    ("Buffer depth", ("buffer/depth", "buffer/capacity")),
    ("Staleness", ("staleness/mean", "staleness/max")),
    ("Weight-sync latency (ms)", ("sync/latency_ms",)),
    ("Inference tokens/s", ("inference/tokens_per_s",)),
    ("Trainer tokens/s", ("trainer/tokens_per_s",)),
    ("Model FLOPs utilisation", ("trainer/mfu",)),
    ("Idle fraction", ("trainer/idle_frac", "inference/idle_frac", "inference/asleep_frac")),
    (
        "Buffer rejections (groups)",
        ("buffer/dropped_stale", "buffer/requeued", "buffer/regenerated", "buffer/dropped_uniform"),
    ),
    ("Trainer starved (s)", ("buffer/starved_s",)),
    ("Reward pool busy fraction", ("reward/pool_busy_frac",)),
    ("Scoring lag (ms)", ("reward/scoring_lag_ms",)),
    ("Partial rollouts (sequences)", ("rollout/partial_aborted", "rollout/partial_resumed", "rollout/partial_retried")),
    ("Eval (held-out prompts)", ("eval/pass@1", "eval/pass@k", "eval/reward_mean")),
    ("Behaviour-trainer mismatch (nats)", ("mismatch/kl",)),
    ("MoE routing agreement", ("routing/agreement",)),
    # Per-rank metrics: one line per trainer rank (runs with a trainer pool only).
    ("Trainer ranks: busy fraction", ("trainer/rank_busy_frac",)),
    ("Trainer ranks: compute and communication (s)", ("trainer/rank_compute_s", "trainer/rank_comm_s")),
    ("Trainer ranks: bytes moved", ("trainer/rank_comm_bytes",)),
)

# The per-step series computed from the trained batch and the weights alone (no clock, no
# buffer occupancy): two runs that train the same batches from the same weights, as a
# replay of a run does, repeat them step for step. Every other series reads a clock or
# the buffer's state, which differ between any two runs.
TRAINED: tuple[str, ...] = (
    "loss",
    "reward/mean",
    "staleness/mean",
    "staleness/max",
    "trainer/grad_norm",
    "policy/version",
    "policy/entropy",
    "is/ratio_mean",
    "is/clipped_frac",
    "ppo/clipped_frac",
    "mismatch/kl",
)

# How many of the latest reward/mean points a reward target is judged on (their mean):
# one step is too noisy. The driver's stop.target_reward and the compare page's "time to
# target" use the same window, so a run that stopped on its target shows that time.
REWARD_WINDOW = 5


def reward_func_series_name(func_name: str) -> str:
    """The part of a reward function's series that names it: its own name where that is
    valid in a series name and at most REWARD_FUNC_NAME_MAX characters, else the name
    lowercased, cut, and suffixed with 8 hex characters of its SHA-1, so two long names
    never share a series."""
    if len(func_name) <= REWARD_FUNC_NAME_MAX and not _SERIES_UNSAFE.search(func_name):
        return func_name
    digest = hashlib.sha1(func_name.encode()).hexdigest()[:_HASH_CHARS]
    cut = REWARD_FUNC_NAME_MAX - _HASH_CHARS - 1
    return f"{_SERIES_UNSAFE.sub('_', func_name.lower())[:cut]}-{digest}"


def reward_func_series(func_name: str, stat: str) -> str:
    """`rewards/<function>/<stat>` (stat: mean or std): TRL's series for one reward function."""
    return f"{REWARD_FUNC_PREFIX}{reward_func_series_name(func_name)}/{stat}"
