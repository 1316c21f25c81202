"""Multi-agent runs through the real driver and actors: propose_solve's episodes on Ray,
with the batch barrier and scheduled by episode with overcommit (workers/rollout/episode_scheduler.py).
A one-agent multi-turn task (calculator) scheduled by episode runs in test_task_runs.py."""

from __future__ import annotations

from tests.engine.helpers import run_inline
from workers.rollout.episode_scheduler import OVERCOMMIT_ENDS_LATE_ENV

# Each agent's environment: a 20 ms median wait whose p90 is 5× it.
ENVIRONMENT = {"proposer_median_s": 0.02, "proposer_p90_ratio": 5, "solver_median_s": 0.02, "solver_p90_ratio": 5}


def multi_agent_run(
    run_id: int,
    cache_dir: str,
    mode: str,
    buffer: dict,
    steps: int = 5,
    update_mode: str = "in_flight",
    env: dict | None = None,
) -> dict:
    summary = run_inline(
        run_id,
        cache_dir,
        env,
        mode=mode,
        task={"name": "propose_solve", "options": ENVIRONMENT},
        warm_start={"steps": 60, "noisy_steps": 0, "batch_size": 32, "lr": 3e-3},
        inference={"max_new_tokens": 6},
        sync={"update_mode": update_mode},
        buffer={"capacity": 2, "max_staleness": 1, **buffer},
        stop={"max_steps": steps},
    )
    assert summary["state"] == "succeeded", summary["error"]
    return summary


def last(series: dict, name: str) -> float:
    return series[name][-1][1]


def test_a_synchronous_run_with_overcommit_trains_late_episodes_a_step_later(cluster, cache_dir):
    # The hook holds each version's overcommitted groups until its batch is taken: the
    # drawn waits alone end them after it on most steps, not on every one.
    summary = multi_agent_run(
        2501, cache_dir, "sync", {"unit": "episode", "overcommit": 2}, env={OVERCOMMIT_ENDS_LATE_ENV: "1"}
    )
    series = summary["series"]
    assert len(series["loss"]) == 5
    for agent in ("proposer", "solver"):
        assert {f"agent/{agent}/{stat}" for stat in ("reward_mean", "p50_s", "p90_s")} <= set(series)
        assert all(0.0 <= v <= 1.0 for _, v in series[f"agent/{agent}/reward_mean"])
        # Each agent's turn waits at least its environment's draw: p90 above its median.
        assert all(v > 0 for _, v in series[f"agent/{agent}/p90_s"])
    assert {"episode/p50_s", "episode/p90_s", "episode/tail_ratio"} <= set(series)
    # A synchronous run admits nothing ahead: the only late groups are the overcommitted
    # ones, each trained one version late and never more. Under the hook each batch after
    # the first starts with the two groups the batch before left.
    late = [v for _, v in series["buffer/late_groups"]]
    assert late == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert max(v for _, v in series["staleness/max"]) == 1.0
    episodes = summary["episodes"]
    assert episodes["episode/p90_s"] >= episodes["episode/p50_s"] > 0
    assert episodes["agent/solver/p50_s"] > 0


def test_a_synchronous_barrier_run_trains_every_episode_on_the_version_that_made_it(cluster, cache_dir):
    summary = multi_agent_run(2502, cache_dir, "sync", {"unit": "group"}, steps=3)
    series = summary["series"]
    assert last(series, "buffer/late_groups") == 0.0
    assert max(v for _, v in series["staleness/max"]) == 0.0
    assert "agent/proposer/reward_mean" in series and "episode/p90_s" in series


def test_an_async_run_of_episodes_keeps_staleness_within_its_bound_and_evaluates(cluster, cache_dir):
    summary = run_inline(
        2504,
        cache_dir,
        task={"name": "propose_solve", "options": ENVIRONMENT},
        warm_start={"steps": 60, "noisy_steps": 0, "batch_size": 32, "lr": 3e-3},
        inference={"max_new_tokens": 6},
        sync={"update_mode": "in_flight"},
        buffer={"capacity": 2, "max_staleness": 1, "unit": "episode"},
        eval={"every_steps": 2, "num_prompts": 8},
        stop={"max_steps": 4},
    )
    assert summary["state"] == "succeeded", summary["error"]
    series = summary["series"]
    assert max(v for _, v in series["staleness/max"]) <= 1.0
    assert summary["episodes"]["episode/p50_s"] > 0
    # Episodes are always in flight under unit 'episode': the eval pass still runs when due.
    assert {step for step, _ in series["eval/pass@1"]} >= {2, 4}
