"""How long episodes took, on the scheduler's clocks (workers/rollout/episode_scheduler.py):
a record per ended episode, which the inference worker reports, and the metrics over
them, which the driver writes (the `episode/*` and `agent/<agent>/*` series). numpy only:
the driver reads these and imports nothing of generation's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.core.metric_names import agent_series


@dataclass(frozen=True)
class EpisodeTiming:
    """One ended episode: each agent's wait and the whole episode's."""

    agents: dict[str, float]  # agent → seconds from its turn's start to its environment's answer
    total_s: float  # the episode's, first turn's start to the last answer


def timing_metrics(timings: list[EpisodeTiming]) -> dict[str, float]:
    """episode/p50_s, p90_s and tail_ratio, and agent/<agent>/p50_s and p90_s, over
    `timings` (nothing when there are none). Percentiles by linear interpolation
    between order statistics (numpy's default, as the benches read them)."""
    if not timings:
        return {}
    totals = np.array([t.total_s for t in timings])
    p50, p90 = np.percentile(totals, [50, 90])
    out = {"episode/p50_s": float(p50), "episode/p90_s": float(p90)}
    if p50 > 0:
        out["episode/tail_ratio"] = float(p90 / p50)
    per_agent: dict[str, list[float]] = {}
    for t in timings:
        for agent, seconds in t.agents.items():
            per_agent.setdefault(agent, []).append(seconds)
    for agent, values in per_agent.items():
        a50, a90 = np.percentile(values, [50, 90])
        out[agent_series(agent, "p50_s")] = float(a50)
        out[agent_series(agent, "p90_s")] = float(a90)
    return out
