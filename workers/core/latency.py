"""Environment latency with a heavy tail, set on purpose: how long an agent's environment
takes to answer each of its turns (a sandbox run, a tool, a judge).

Agentic work is dominated by such waits, and their tail decides how long a batch of
episodes takes: a step that needs every episode of its batch waits for the slowest. A
task draws its environment's time from this distribution so what stragglers cost, and
what scheduling by episode recovers, can be measured with the tail the user sets.

A draw is lognormal (the usual shape of service times: positive, skewed right) with a
given median m and ratio r of the 90th percentile to the median:
ln T ~ N(ln m, σ²) with σ = ln r / z₀.₉, z₀.₉ the standard normal's 90th percentile.
r = 1 is a constant m; m = 0 is no wait at all.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

Z90 = NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class Latency:
    median_s: float = 0.0
    p90_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_s) and self.median_s >= 0):
            raise ValueError(f"Latency median_s must be a finite number ≥ 0 (got {self.median_s})")
        if not (math.isfinite(self.p90_ratio) and self.p90_ratio >= 1):
            raise ValueError(f"Latency p90_ratio must be a finite number ≥ 1 (got {self.p90_ratio})")

    @property
    def sigma(self) -> float:
        """The lognormal's σ (of ln T)."""
        return math.log(self.p90_ratio) / Z90

    def draw(self, rng: random.Random) -> float:
        """One wait, in seconds."""
        if self.median_s == 0:
            return 0.0
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def quantile(self, q: float) -> float:
        """The distribution's `q` quantile (0 < q < 1), in seconds."""
        return self.median_s * math.exp(self.sigma * NormalDist().inv_cdf(q))
