"""The metric vocabulary (workers/core/metric_names.py) against what the engine emits, both ways.

Known: the reporter, the run's one way out for a point, refuses a series outside the
vocabulary, so a run that emits an unknown name fails; here the pieces that compute the
figures are checked without Ray: every name `Trainer.train_step` returns (every
correction method, one and several minibatches, with and without an entropy bonus), the
buffer's stats and the inference workers' per-step windows.

Emitted: a series marked `only` is emitted under a condition; each condition is tested
here, in both directions. That every other series is emitted by a real run is checked by
tests/engine/test_driver.py (`test_a_launched_run_reports_the_vocabulary_and_succeeds`).
"""

from __future__ import annotations

import typing

import pytest

from tests.engine import test_mfu as mfu_tests
from tests.engine.helpers import fixed_groups, small_config
from workers.config.run_config import BufferConfig
from workers.core.metric_names import METRICS, NAMES, PER_RANK, TRAINED, metric_of, rank_series
from workers.core.timeline import ASLEEP, GENERATE, Segment, StepWindows, Timeline
from workers.rollout.evaluation import SERIES as EVAL_SERIES
from workers.rollout.evaluation import eval_metrics, is_due
from workers.run.buffer import RolloutBuffer, plan
from workers.run.reporter import MetricsReporter
from workers.train.loss import METHODS
from workers.train.trainer import RankResult, Trainer

BY_NAME = {m.name: m for m in METRICS}


def test_the_vocabulary_spells_each_name_once():
    assert len(NAMES) == len(METRICS)


def test_the_series_a_replay_repeats_are_named_once_each_and_read_no_clock():
    assert len(set(TRAINED)) == len(TRAINED) and set(TRAINED) <= NAMES
    clocked = [name for name in TRAINED if metric_of(name).unit in ("s", "ms") or "/s" in metric_of(name).unit]
    assert not clocked, clocked


def test_the_reporter_refuses_a_series_outside_the_vocabulary():
    rep = MetricsReporter(1, None)
    with pytest.raises(ValueError) as err:
        rep.add("x/y", 1, 0.5)
    assert str(err.value) == "unknown metric series 'x/y': add it to workers.core.metric_names.METRICS"
    with pytest.raises(ValueError, match="'reward/meen'"):
        rep.add_many({"reward/meen": 0.5}, step=2)
    assert rep.points == []  # nothing refused was queued
    with pytest.raises(ValueError, match="'trainer/rank_busy_frac'"):
        rep.add("trainer/rank_busy_frac", 3, 1.0)  # a per-rank metric goes out per rank
    with pytest.raises(ValueError, match="'trainer/rank_busy_frac/x'"):
        rep.add("trainer/rank_busy_frac/x", 3, 1.0)
    with pytest.raises(ValueError, match="'reward/mean/0'"):
        rep.add("reward/mean/0", 3, 1.0)
    sent = {rank_series(name, 1) if name in PER_RANK else name for name in NAMES}
    for series in sorted(sent):
        rep.add(series, 3, 1.0)
    assert {p["series"] for p in rep.points} == sent


@pytest.mark.parametrize("minibatches, entropy_coef", [(1, 0.0), (2, 0.01)])
@pytest.mark.parametrize("method", METHODS)
def test_train_step_returns_only_known_names(tiny_model_dir, method, minibatches, entropy_coef):
    cfg = small_config(
        correction={"method": method}, trainer={"minibatches": minibatches, "entropy_coef": entropy_coef}
    )
    metrics = Trainer(cfg, tiny_model_dir).train_step(fixed_groups(tiny_model_dir, cfg))
    assert set(metrics) <= NAMES, f"not in METRICS: {sorted(set(metrics) - NAMES)}"
    # Mode-specific: pipelinerl_reinforce weighs pi_theta/mu directly, with no PPO clip.
    for name in ("ppo/clipped_frac", "ppo/clipped_low_frac", "ppo/clipped_high_frac"):
        assert (name in metrics) == (method != "pipelinerl_reinforce")
        assert "pipelinerl_reinforce" in BY_NAME[name].only


def test_train_step_reports_the_batch_spread_lengths_and_learning_rate(tiny_model_dir):
    """The figures a GRPO user looks for first (TRL's reward_std, frac_reward_zero_std,
    completions/* and learning_rate), from every step."""
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg)
    metrics = Trainer(cfg, tiny_model_dir).train_step(groups)
    assert metrics["trainer/lr"] == cfg.trainer.lr
    lengths = [len(r.completion_ids) for g in groups for r in g.rollouts]
    assert metrics["completion/length_max"] == max(lengths)
    assert {"reward/std", "reward/zero_std_frac", "completion/length_mean", "completion/clipped_frac"} <= set(metrics)


BUFFER_MODES = typing.get_args(BufferConfig.model_fields["mode"].annotation)


@pytest.mark.parametrize("mode", BUFFER_MODES)
def test_the_buffer_stats_are_known_and_capacity_is_missing_only_from_a_stream(mode):
    bp = plan(BufferConfig(mode=mode), "async", batch_groups=4)
    stats = RolloutBuffer(bp.capacity_groups, bp.max_staleness, bp.on_stale).stats()
    assert set(stats) <= NAMES, f"not in METRICS: {sorted(set(stats) - NAMES)}"
    assert ("buffer/capacity" in stats) == (mode != "unbounded")
    assert "unbounded" in BY_NAME["buffer/capacity"].only


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_dropped_uniform_groups_are_counted_only_with_dynamic_sampling(dynamic_sampling):
    from workers.config.run_config import TrainerConfig

    bp = plan(BufferConfig(), "async", 4, TrainerConfig(dynamic_sampling=dynamic_sampling))
    stats = RolloutBuffer(bp.capacity_groups, bp.max_staleness, bp.on_stale, bp.drop_uniform).stats()
    assert set(stats) <= NAMES
    assert ("buffer/dropped_uniform" in stats) == dynamic_sampling
    assert BY_NAME["buffer/dropped_uniform"].only == "trainer.dynamic_sampling"


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_reference_kl_is_reported_only_with_a_kl_penalty(tiny_model_dir, kl_coef):
    cfg = small_config(trainer={"kl_coef": kl_coef})
    metrics = Trainer(cfg, tiny_model_dir).train_step(fixed_groups(tiny_model_dir, cfg))
    assert set(metrics) <= NAMES
    assert ("loss/kl_ref" in metrics) == (kl_coef > 0)
    assert BY_NAME["loss/kl_ref"].only == "trainer.kl_coef > 0"


def test_the_step_windows_are_known_names():
    windows = StepWindows(num_workers=1)
    windows.report(0, [Segment(GENERATE, 0.0, 1.0, tokens=10)], None, now=2.0)
    assert set(windows.window(0.0, 2.0)) <= NAMES


def test_the_asleep_fraction_comes_from_a_worker_whose_vllm_sleeps_only():
    """inference/asleep_frac: a worker's `asleep` segments (inference.sleep_level ≥ 1,
    the only time its loop sleeps vLLM: InferenceHost._sleeper) over the step's window;
    a run that never sleeps has no such series. A sleep still going on at a drain is
    closed there and goes on, so the driver sees it before the worker wakes."""
    awake = StepWindows(num_workers=2)
    awake.report(0, [Segment(GENERATE, 0.0, 1.0, tokens=10)], None, now=2.0)
    assert "inference/asleep_frac" not in awake.window(0.0, 2.0)

    timeline = Timeline()
    timeline.fall_asleep()
    first, _, at = timeline.drain()
    second, _, _ = timeline.drain()
    timeline.wake()
    last, _, _ = timeline.drain()
    pieces = first + second + last
    assert [seg.kind for seg in pieces] == [ASLEEP] * len(pieces) and pieces
    assert all(a.t1 == b.t0 for a, b in zip(pieces, pieces[1:], strict=False)) and first[-1].t1 == at
    assert timeline.drain()[0] == []  # awake: nothing more

    slept = StepWindows(num_workers=2)
    slept.report(0, [Segment(ASLEEP, 1.0, 2.0)], None, now=2.0)
    slept.report(1, [Segment(ASLEEP, 0.5, 3.0)], None, now=3.0)
    figures = slept.window(0.0, 2.0)
    assert set(figures) <= NAMES and figures["inference/asleep_frac"] == (1.0 + 1.5) / (2 * 2.0)
    assert BY_NAME["inference/asleep_frac"].only == "inference.sleep_level ≥ 1"


def test_the_eval_series_come_from_a_pass_and_a_pass_is_due_only_with_eval_on():
    # Both ways in a real run: tests/engine/test_eval_runs.py (on) and test_task_runs.py's
    # calculator run, which leaves eval off and emits no eval series.
    assert set(eval_metrics([[1.0, 0.0]], k=2)) == set(EVAL_SERIES) <= NAMES
    assert not any(is_due(v, 0, every_steps=0) for v in range(100))
    assert is_due(2, 0, every_steps=2)
    assert all(BY_NAME[name].only == "eval.every_steps > 0" for name in EVAL_SERIES)


def test_per_rank_series_come_from_a_trainer_pool_only(tiny_model_dir):
    """A single trainer's step names no rank; a pool's names each of its ranks (its
    parts' figures: the real pool in tests/engine/test_trainer_pool.py)."""
    cfg = small_config()
    trainer = Trainer(cfg, tiny_model_dir)
    groups = fixed_groups(tiny_model_dir, cfg)
    assert not set(trainer.train_step(groups)) & set(sent_by_ranks(2))
    parts = [RankResult([0.1], [{}], [1.0], step_s=0.3, comm_s=0.1, comm_bytes=10) for _ in range(2)]
    trainer.pool = object()  # what step_metrics asks of a pool: that there is one
    metrics = trainer.step_metrics(groups, parts, start=0.0)
    assert set(sent_by_ranks(2)) - {rank_series("trainer/rank_busy_frac", r) for r in range(2)} <= set(metrics)
    assert all(metric_of(name) is not None for name in metrics)
    assert all(BY_NAME[name].only == "trainer.backend ddp or fsdp2" for name in PER_RANK)


def sent_by_ranks(ranks: int) -> list[str]:
    return [rank_series(name, r) for name in sorted(PER_RANK) for r in range(ranks)]


def test_routing_agreement_is_reported_only_with_keep_routing(tmp_path):
    from tests.engine.test_keep_records import _first_step
    from workers.model.tiny_hf import make_tiny_checkpoint

    moe = make_tiny_checkpoint(str(tmp_path / "moe"), "qwen2_moe", hidden_size=64)
    with_replay = _first_step(moe, {"keep_routing": True}, {})[2]
    assert set(with_replay) <= NAMES and 0.0 <= with_replay["routing/agreement"] <= 1.0
    assert "routing/agreement" not in _first_step(moe, {}, {})[2]


def test_the_reward_pool_series_come_from_a_reward_pool_only(tmp_path):
    from workers.rollout.reward_stage import POOL_SERIES, RewardReport
    from workers.run.driver import RunMetrics

    metrics = RunMetrics(MetricsReporter(1, None, "", str(tmp_path)), num_workers=1)
    metrics.add_rewards([], version=1, new_steps=True)  # rewards.workers 0: no reward worker reports
    assert not POOL_SERIES & set(metrics.series)
    metrics.add_rewards([RewardReport(0.5, 0.0, 1.0, [0.01])], version=2, new_steps=True)
    assert set(metrics.series) == POOL_SERIES <= NAMES
    assert all(BY_NAME[name].only == "rewards.workers ≥ 1" for name in POOL_SERIES)


def test_the_episode_series_come_from_a_multi_agent_tasks_episodes_only(tmp_path):
    from workers.core.metric_names import MULTI_AGENT, is_agent_series
    from workers.rollout.episode_timing import EpisodeTiming
    from workers.rollout.partial_rollouts import PartialCounts
    from workers.run.driver import RunMetrics
    from workers.run.messages import InferenceReport

    def report(episodes):
        return InferenceReport([], None, 0.0, [], 1, None, PartialCounts(), episodes=episodes)

    metrics = RunMetrics(MetricsReporter(1, None, "", str(tmp_path)), num_workers=1)
    metrics.add_inference([report([])], version=1, new_steps=True)  # a single-agent task's worker reports none
    assert not any(s.startswith("episode/") or is_agent_series(s) for s in metrics.series)
    timings = [
        EpisodeTiming({"proposer": 1.0, "solver": 2.0}, 3.0),
        EpisodeTiming({"proposer": 2.0, "solver": 4.0}, 6.0),
    ]
    metrics.add_inference([report(timings)], version=2, new_steps=True)
    episode = {s for s in metrics.series if s.startswith("episode/")}
    assert episode == {"episode/p50_s", "episode/p90_s", "episode/tail_ratio"} <= NAMES
    agents = {s for s in metrics.series if is_agent_series(s)}
    assert agents == {f"agent/{a}/{q}" for a in ("proposer", "solver") for q in ("p50_s", "p90_s")}
    assert all(BY_NAME[name].only == MULTI_AGENT for name in episode)
    assert all(metric_of(name) is not None and metric_of(name).only == MULTI_AGENT for name in agents)


# Each series marked `only`, and the test above that checks its condition both ways.
CONDITION_TESTS = {
    "buffer/capacity": test_the_buffer_stats_are_known_and_capacity_is_missing_only_from_a_stream,
    "ppo/clipped_frac": test_train_step_returns_only_known_names,
    "ppo/clipped_low_frac": test_train_step_returns_only_known_names,
    "ppo/clipped_high_frac": test_train_step_returns_only_known_names,
    "buffer/dropped_uniform": test_dropped_uniform_groups_are_counted_only_with_dynamic_sampling,
    "loss/kl_ref": test_the_reference_kl_is_reported_only_with_a_kl_penalty,
    "routing/agreement": test_routing_agreement_is_reported_only_with_keep_routing,
    **dict.fromkeys(EVAL_SERIES, test_the_eval_series_come_from_a_pass_and_a_pass_is_due_only_with_eval_on),
    **dict.fromkeys(PER_RANK, test_per_rank_series_come_from_a_trainer_pool_only),
    "reward/pool_busy_frac": test_the_reward_pool_series_come_from_a_reward_pool_only,
    "reward/scoring_lag_ms": test_the_reward_pool_series_come_from_a_reward_pool_only,
    "trainer/mfu": mfu_tests.test_the_trainer_reports_mfu_only_on_a_device_with_a_peak,
    "inference/asleep_frac": test_the_asleep_fraction_comes_from_a_worker_whose_vllm_sleeps_only,
    **dict.fromkeys(
        ("episode/p50_s", "episode/p90_s", "episode/tail_ratio"),
        test_the_episode_series_come_from_a_multi_agent_tasks_episodes_only,
    ),
}


def test_every_mode_specific_series_has_its_condition_tested():
    marked = {m.name for m in METRICS if m.only}
    assert marked == set(CONDITION_TESTS), (
        "a series marked `only` needs a test of its condition here (and one not marked, none)"
    )
