"""A planner: the GPU split and bounds that serve a goal best, searched in the simulator.

Given a run's config, a cluster and a workload, `plan` simulates the config under each
inference:trainer split of the GPUs (`Cluster.inference_share`), each staleness bound
(`buffer.max_staleness`, async runs), each buffer depth (`buffer.capacity`) and each
weight-sync protocol that crosses GPUs, and ranks them by the goal: samples per second,
or the simulated seconds to a number of trained samples. What it searches are the knobs
the simulated run's advice names (workers/simulate/advice.py); a candidate the config
refuses (a bound its preset's mode cannot take) is left out, not guessed. The simulator
models speed, not learning: a looser staleness bound it recommends is faster per sample
generated and may learn less per sample trained (docs/learning.md measures that cost).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from workers.config.run_config import RunConfig
from workers.core.merge import deep_merge
from workers.simulate.run import simulate

if TYPE_CHECKING:
    from workers.simulate.cluster import Cluster
    from workers.simulate.run import Workload

SHARES = (0.25, 0.375, 0.5, 0.625, 0.75)
STALENESS = (1, 2, 4)
CAPACITIES = (2, 4)
# Between GPUs: the broadcast or the object store (a filesystem sync is slower at every
# size the simulator knows; cuda_ipc needs the pools on one GPU).
PROTOCOLS = ("collective", "object_store")


@dataclass(frozen=True)
class Candidate:
    """One setting of the searched knobs and what the simulator made of it."""

    inference_share: float
    max_staleness: int
    capacity: int
    protocol: str
    samples_per_s: float
    seconds_to_goal: float | None  # None: the goal's samples were not reached in the steps simulated
    trainer_busy: float
    inference_busy: float
    dropped_share: float

    def overrides(self) -> dict:
        """The config overrides that launch this candidate (the split is the cluster's)."""
        return {
            "buffer": {"max_staleness": self.max_staleness, "capacity": self.capacity},
            "sync": {"protocol": self.protocol},
        }


def candidates(cfg: RunConfig) -> list[tuple[float, int, int, str]]:
    """(share, max_staleness, capacity, protocol) to try: the bound only where it acts."""
    bounds = STALENESS if cfg.mode == "async" else (cfg.buffer.max_staleness,)
    return [(s, k, c, p) for s in SHARES for k in bounds for c in CAPACITIES for p in PROTOCOLS]


def staleness_caveat(cfg: RunConfig, best: Candidate) -> str | None:
    """What a plan whose best setting loosens `cfg`'s staleness bound does not show, in a
    sentence for the planned run's page: the search counts staleness as speed only (the
    figure is docs/league.md's sweep of `async` on the default task: at staleness 4 against
    1, 0.0146 against 0.0251 held-out pass@1 gained per 1,000 samples)."""
    given = cfg.buffer.max_staleness
    if best.max_staleness <= given:
        return None
    return (
        f"This plan raises buffer.max_staleness from {given} to {best.max_staleness}. The simulator counts "
        "that as speed only: trained on data more versions old, a run can learn less per sample (on the "
        "default task, staleness 4 instead of 1 cut the held-out pass@1 gained per sample by two fifths). "
        "Launch both settings on a short run to see what it costs yours."
    )


def plan(
    cfg: RunConfig, cluster: Cluster, workload: Workload, *, steps: int = 30, goal_samples: int | None = None
) -> list[Candidate]:
    """Every candidate the config admits, best first: by seconds to `goal_samples` when
    given (those that never reach it last), else by samples/s."""
    out = []
    base = cfg.model_dump(mode="json")
    for share, staleness, capacity, protocol in candidates(cfg):
        fields = {"buffer": {"max_staleness": staleness, "capacity": capacity}, "sync": {"protocol": protocol}}
        try:
            tried = RunConfig.model_validate(deep_merge(base, fields))
            result = simulate(tried, replace(cluster, inference_share=share), workload, steps=steps)
        except ValueError:  # the config or the cluster refuses this setting
            continue
        s = result.summary
        out.append(
            Candidate(
                share,
                staleness,
                capacity,
                protocol,
                s["samples_per_s"],
                result.time_to_samples(goal_samples) if goal_samples else None,
                s["trainer_busy"],
                s["inference_busy"],
                s["dropped_share"],
            )
        )
    if goal_samples:
        return sorted(out, key=lambda c: (c.seconds_to_goal is None, c.seconds_to_goal or 0.0, -c.samples_per_s))
    return sorted(out, key=lambda c: -c.samples_per_s)
