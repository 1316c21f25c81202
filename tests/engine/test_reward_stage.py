"""The reward stage (workers/rollout/reward_stage.py): a pool of reward workers scoring after
generation or, pipelined, chunk by chunk while it runs."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
import ray
from pydantic import ValidationError

from tests.engine.helpers import run_inline, small_config
from workers.inference.torch_backend import TorchBackend
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rl_tasks.reward_funcs import score_group
from workers.rollout.generation import generate
from workers.rollout.reward_stage import POOL_SERIES, RewardPool, RewardReport, RewardWorker, pool_metrics


@pytest.mark.parametrize(
    ("rewards", "field"),
    [
        ({"mode": "pipelined"}, "rewards.workers"),
        ({"workers": 1, "scorer": "model"}, "rewards.model_path"),
        ({"scorer": "model", "model_path": "/x"}, "rewards.workers"),
        ({"workers": 1, "model_path": "/x"}, "rewards.scorer"),
        ({"workers": 1, "credit": "process"}, "rewards.credit"),
    ],
)
def test_it_refuses_a_reward_stage_it_cannot_run_naming_the_field(rewards, field):
    with pytest.raises(ValidationError, match=field):
        small_config(rewards=rewards)


def test_the_pool_figures_are_busy_over_wall_time_and_the_mean_lag():
    reports = [RewardReport(1.0, 0.0, 2.0, [0.1, 0.3]), RewardReport(0.5, 0.0, 2.0)]
    figures = pool_metrics(reports)
    assert figures == pytest.approx({"reward/pool_busy_frac": 0.375, "reward/scoring_lag_ms": 200.0})
    assert set(figures) == POOL_SERIES


class SlowDecode:
    """A torch backend whose decode steps take STEP_S each, as a model worth scoring
    would: the tiny model decodes in microseconds, less than one Ray call."""

    STEP_S = 0.02

    def __init__(self, model_dir: str) -> None:
        self.backend = TorchBackend(model_dir)

    def generate(self, *args, **kwargs):
        return self.backend.generate(*args, **kwargs)

    def start(self, *args, **kwargs):
        session = self.backend.start(*args, **kwargs)
        step = session.step

        def slow_step():
            time.sleep(self.STEP_S)
            return step()

        session.step = slow_step
        return session


def _generate(model_dir: str, mode: str, cost_ms: float, chunk_tokens: int = 2, credit: str = "outcome"):
    """One generate call of an inference worker with a pool of 2 reward workers;
    returns (groups, seconds it took, when generation ended, the pool's reports)."""
    rewards = {
        "workers": 2,
        "mode": mode,
        "chunk_tokens": chunk_tokens,
        "verifier_cost_ms_per_token": cost_ms,
        "credit": credit,
    }
    cfg = small_config(rewards=rewards, inference={"max_new_tokens": 16}, task={"reward": "prefix"})
    workers = [RewardWorker.remote(cfg, k) for k in range(2)]
    ray.get([w.ready.remote() for w in workers])
    pool = RewardPool(workers, cfg.rewards)
    generated = []
    pool.on_wait = lambda tokens: generated.append(time.time())
    task, tok = make_task(cfg.task), CharTokenizer.load(model_dir)
    prompts = task.sample(cfg.trainer.batch_groups, random.Random(0))
    ray.get([w.drain_metrics.remote() for w in workers])
    t0 = time.time()
    groups = generate(SlowDecode(model_dir), task, tok, prompts, cfg, 0, 7, rewards=pool).groups
    took = time.time() - t0
    reports = ray.get([w.drain_metrics.remote() for w in workers])
    for w in workers:
        ray.kill(w)
    return task, tok, groups, took, generated[0], reports


def test_pipelined_scores_chunks_while_the_completions_are_generated(cluster, tiny_model_dir):
    task, tok, groups, took, generated_at, reports = _generate(tiny_model_dir, "pipelined", cost_ms=2.0)
    # Every completion's reward is the verifier's on its whole text.
    for g in groups:
        texts = [tok.decode(r.completion_ids) for r in g.rollouts]
        assert [r.reward for r in g.rollouts] == score_group(task, g.prompt, g.answer, texts, []).totals
    scored_at = [t for r in reports for t in r.scored_at]
    chunks = sum(r.chunks for r in reports)
    completions = sum(len(g.rollouts) for g in groups)
    assert chunks > completions  # more than one chunk per completion on average
    # Chunks were scored before generation had finished...
    assert sum(t < generated_at for t in scored_at) > chunks // 2
    # ...and a token waited for its score far less than generation took.
    lags = [lag for r in reports for lag in r.lags_s]
    assert sum(lags) / len(lags) < took / 2
    assert 0 < pool_metrics(reports)["reward/pool_busy_frac"] <= 1


def test_pipelined_process_credit_keeps_each_chunks_end_and_score_on_its_rollout(cluster, tiny_model_dir):
    task, tok, groups, *_ = _generate(tiny_model_dir, "pipelined", cost_ms=0.0, chunk_tokens=3, credit="process")
    for g in groups:
        for r in g.rollouts:
            n = len(r.completion_ids)
            # A chunk every 3 tokens, the final one at the completion's end (which may
            # fall on a multiple of 3: one step then, not two).
            assert r.step_ends == [*range(3, n, 3), n]
            # Each step's score is the verifier's on the text up to its end; the last
            # step's is the reward.
            prefixes = [tok.decode(r.completion_ids[:end]) for end in r.step_ends]
            assert r.step_scores == [score_group(task, g.prompt, g.answer, [t], []).totals[0] for t in prefixes]
            assert r.step_scores[-1] == r.reward
    # An outcome run's rollouts carry no steps.
    _, _, outcome, *_ = _generate(tiny_model_dir, "pipelined", cost_ms=0.0, chunk_tokens=3)
    assert all(not r.step_ends and not r.step_scores for g in outcome for r in g.rollouts)


def test_after_scores_each_group_once_generation_is_done(cluster, tiny_model_dir):
    task, tok, groups, _, generated_at, reports = _generate(tiny_model_dir, "after", cost_ms=0.0)
    assert all(t >= generated_at for r in reports for t in r.scored_at)
    assert sum(r.chunks for r in reports) == sum(len(g.rollouts) for g in groups)
    for g in groups:
        texts = [tok.decode(r.completion_ids) for r in g.rollouts]
        assert [r.reward for r in g.rollouts] == score_group(task, g.prompt, g.answer, texts, []).totals


@pytest.mark.slow
def test_a_run_with_a_pipelined_reward_pool_on_process_credit_reports_its_busy_fraction_and_lag(cluster, cache_dir):
    # Trained on process credit, the step scores only a pipelined pool makes (one run
    # proves both). A pool scoring `after` generation, on a declared GPU of its own, is the
    # reward worker's run in test_placement.py, which checks the same figures.
    summary = run_inline(
        2402,
        cache_dir,
        rewards={"workers": 1, "mode": "pipelined", "credit": "process", "chunk_tokens": 2},
        stop={"max_steps": 3},
    )
    assert summary["state"] == "succeeded", summary["error"]
    series = summary["series"]
    assert len(series["loss"]) == 3
    assert set(series) >= POOL_SERIES
    # A collection in which the worker scored nothing (a loaded host can bring one) is a
    # true 0; the pool must have worked in some.
    busy = [v for _, v in series["reward/pool_busy_frac"]]
    assert all(0 <= v <= 1 for v in busy) and any(v > 0 for v in busy), busy
    assert all(v > 0 for _, v in series["reward/scoring_lag_ms"])
    gpus = {row["actor"]: row["gpu_ids"] for row in summary["placement"]}
    assert gpus["reward worker 0"] == []


def test_a_final_chunk_repeating_the_last_steps_text_is_one_step_and_a_restart_forgets_the_steps(cluster):
    cfg = small_config(rewards={"workers": 1, "mode": "pipelined", "chunk_tokens": 2}, task={"reward": "prefix"})
    worker = RewardWorker.remote(cfg, 0)
    pool = RewardPool([worker], cfg.rewards)
    stream = pool.stream([("ab", "ab")], 1, lambda ids: "".join(chr(ord("a") + i) for i in ids))
    seq = SimpleNamespace(token_ids=[0, 1], finish_reason=None)
    stream.on_step([seq])  # a chunk at 2 tokens
    seq.token_ids = [0]  # abort_retry restarted it: its chunks so far are forgotten
    stream.on_step([seq])
    seq.token_ids = [0, 2, 1]
    stream.on_step([seq])  # a chunk at 3 tokens, all new since the restart
    seq.token_ids = [0, 2, 1, 1, 0]
    # Left unfinished (a stepped mode): a chunk due at 5, then its final chunk at 5 too.
    stream.scores([seq])
    ray.kill(worker)
    assert stream.step_ends == [[3, 5]]
    assert len(stream.step_scores[0]) == 2
