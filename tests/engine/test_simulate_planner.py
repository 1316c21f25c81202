"""The planner (workers/simulate/planner.py): it searches the GPU split, the staleness
bound, the buffer depth and the sync protocol in the simulator, and its recommendation
beats the default split where that starves a pool."""

from __future__ import annotations

from dataclasses import replace

from workers.config.presets import build
from workers.simulate import QWEN25_7B, Cluster, Workload, simulate
from workers.simulate.planner import Candidate, candidates, plan, staleness_caveat

WORKLOAD = Workload(model=QWEN25_7B)


def test_the_recommendation_for_a_7b_model_on_64_gpus_beats_the_default_split():
    cfg = build("async", {})
    cluster = Cluster(gpus=64)
    default = simulate(cfg, cluster, WORKLOAD, steps=30).summary["samples_per_s"]
    ranked = plan(cfg, cluster, WORKLOAD, steps=30)
    best = ranked[0]
    assert best.samples_per_s > 1.1 * default, (best, default)
    assert [c.samples_per_s for c in ranked] == sorted((c.samples_per_s for c in ranked), reverse=True)
    # its overrides and split reproduce its figure
    again = simulate(
        build("async", best.overrides()), replace(cluster, inference_share=best.inference_share), WORKLOAD, steps=30
    )
    assert again.summary["samples_per_s"] == best.samples_per_s


def test_a_goal_in_samples_ranks_by_the_time_to_reach_it():
    cfg = build("async", {})
    ranked = plan(cfg, Cluster(gpus=16), WORKLOAD, steps=10, goal_samples=256)
    reached = [c.seconds_to_goal for c in ranked if c.seconds_to_goal is not None]
    assert reached and reached == sorted(reached)


def test_a_sync_run_searches_no_staleness_bound():
    assert {k for _, k, _, _ in candidates(build("sync", {}))} == {build("sync", {}).buffer.max_staleness}
    assert {k for _, k, _, _ in candidates(build("async", {}))} == {1, 2, 4}


def test_a_plan_that_loosens_the_staleness_bound_says_so_and_one_that_keeps_it_says_nothing():
    def best(staleness: int) -> Candidate:
        return Candidate(0.5, staleness, 2, "collective", 1.0, None, 0.5, 0.5, 0.0)

    cfg = build("async", {"buffer": {"max_staleness": 2}})
    assert staleness_caveat(cfg, best(2)) is None and staleness_caveat(cfg, best(1)) is None
    said = staleness_caveat(cfg, best(4))
    assert said is not None and said.startswith("This plan raises buffer.max_staleness from 2 to 4.")
