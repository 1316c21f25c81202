"""The simulator's costs read off a real run, and its prediction of that run.

A run on the real engine reports, per trainer step, how long the step trained
(`trainer/step_s`), how long the send blocked it (`sync/trainer_ms`), how long an
inference worker took to receive and load new weights (`sync/inference_ms`), the
tokens it generated and the share of the window it generated them in
(`inference/tokens_per_s`, `inference/idle_frac`), and its completions' mean length.
`costs_from_run` turns those into the simulator's three costs; `calibrate` runs the
simulator with them, on the run's own config and pool sizes, and sets the figures the
simulator predicts beside those the run measured: samples/s, the trainer's and the
inference workers' idle shares, and the mean staleness. The costs are means over the
run, so what is checked is the event logic on top of them: how the buffer, the
admission gate and the update mode overlap (or serialise) generation, training and
sync, and how stale the trained tokens come out.

Step 1 is left out on both sides: the real one includes loading the model, the
simulated one the first generation with nothing to overlap it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from workers.rollout.partial_rollouts import STEPPED_MODES
from workers.run.buffer import groups_per_call
from workers.simulate.cluster import Cluster
from workers.simulate.costs import CallProfile, Costs, SyncCost
from workers.simulate.run import Workload, simulate

if TYPE_CHECKING:
    from collections.abc import Sequence

    from workers.config.run_config import RunConfig

Series = dict[str, list[tuple[int, float]]]

# The figures compared, each a step-window-weighted mean over steps 2..N.
FIGURES = ("samples/per_s", "trainer/idle_frac", "inference/idle_frac", "staleness/mean")
# Halvings of the transfer time's interval: to 1/1,000 of the measured latency.
FIT_ROUNDS = 10


@dataclass(frozen=True)
class MeasuredDecode:
    """One inference worker generating at the rate it was measured at: a call's time is
    its tokens over that rate (the prompts' prefill is inside the measured rate). The
    torch backends decode a call's sequences together, so every sequence has a slot and
    each ends at its length's share of the longest one's time."""

    tokens_per_s: float
    load_s: float  # receiving and loading new weights (sync/inference_ms)
    handoff_s: float = 0.0  # a call's admission and put (rollout/handoff_s per call)

    def slots(self, mean_completion: float) -> int:
        return 1 << 30

    def call(self, lengths: np.ndarray, slots: int) -> CallProfile:
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) == 0:
            return CallProfile(lengths, np.zeros(0), 0.0)
        seconds = float(lengths.sum()) / self.tokens_per_s
        return CallProfile(lengths, seconds * lengths / max(int(lengths.max()), 1), seconds)

    def prefill_seconds(self, tokens: float) -> float:
        # A run's series time generate calls whole: nothing in them separates re-prefilling
        # an aborted call's tokens (abort_resume) from decoding, so no figure is invented.
        raise ValueError("a measured run gives no re-prefill cost: sync.update_mode abort_resume is not calibrated")

    def load_seconds(self) -> float:
        return self.load_s

    def handoff_seconds(self) -> float:
        return self.handoff_s


@dataclass(frozen=True)
class MeasuredTrain:
    """A training step at the measured time per trained token, and the trainer's time
    busy outside the step and the send (its bookkeeping between steps)."""

    seconds_per_token: float
    overhead_s: float = 0.0

    def seconds(self, tokens: float, longest: Sequence[float] = ()) -> float:
        # Measured per trained token at the run's own sizes: its stragglers are in the rate.
        return self.seconds_per_token * tokens

    def overhead_seconds(self) -> float:
        return self.overhead_s


def steady(series: Series, samples_per_step: int) -> dict[str, float]:
    """Each of FIGURES over steps 2..N, weighted by the step's wall-time window."""
    rate = dict(series["samples/per_s"])
    steps = sorted(rate)[1:]
    if not steps:
        raise ValueError("a calibration needs at least 2 trainer steps")
    window = {k: samples_per_step / rate[k] for k in steps}
    out = {"samples/per_s": len(steps) * samples_per_step / sum(window.values())}
    for name in FIGURES[1:]:
        points = dict(series.get(name, []))
        have = [k for k in steps if k in points]
        span = sum(window[k] for k in have)
        out[name] = sum(points[k] * window[k] for k in have) / span if span else float("nan")
    return out


def _mean(series: Series, name: str, steps: set[int]) -> float:
    values = [v for k, v in series.get(name, []) if k in steps]
    if not values:
        raise ValueError(f"the run reported no {name} after its first step: it cannot calibrate the simulator")
    return statistics.fmean(values)


def costs_from_run(series: Series, cfg: RunConfig) -> tuple[Costs, Workload, Cluster]:
    """The costs, workload and cluster that describe `cfg`'s measured run to the simulator."""
    samples = cfg.trainer.batch_groups * cfg.trainer.group_size
    rate = dict(series["samples/per_s"])
    steps = set(sorted(rate)[1:])
    window = {k: samples / rate[k] for k in steps}
    workers = cfg.inference.num_workers
    # The inference pool's generating seconds and tokens, summed over the steps' windows.
    idle = dict(series["inference/idle_frac"])
    tok_s = dict(series["inference/tokens_per_s"])
    busy_s = sum((1 - idle[k]) * window[k] * workers for k in steps if k in idle)
    tokens = sum(tok_s[k] * window[k] for k in steps if k in tok_s)
    length = max(1, round(_mean(series, "completion/length_mean", steps)))
    # A sequence's trained tokens: the simulator counts no prompt (prompt_tokens 0), so
    # the measured step time is spread over the completion tokens alone.
    step_s = _mean(series, "trainer/step_s", steps)
    sync_trainer_s = _mean(series, "sync/trainer_ms", steps) / 1e3
    # The trainer's busy share of each window, less the step and the send.
    t_idle = dict(series["trainer/idle_frac"])
    busy_t = statistics.fmean((1 - t_idle[k]) * window[k] for k in steps if k in t_idle)
    train = MeasuredTrain(step_s / (samples * length), max(0.0, busy_t - step_s - sync_trainer_s))
    load_ms = [v for _, v in series.get("sync/inference_ms", [])]
    # Calls made in the windows: their tokens over a call's (every call asks for its
    # share of a batch, groups_per_call).
    call_tokens = groups_per_call(cfg.trainer.batch_groups, workers) * cfg.trainer.group_size * length
    # A stepped mode loads new weights inside its generate calls (once a version), so
    # their time is in the busy seconds; the simulation adds the loads itself.
    load_s = statistics.median(load_ms) / 1e3 if load_ms else 0.0
    if cfg.sync.update_mode in STEPPED_MODES:
        busy_s = max(busy_s - len(steps) * load_s, busy_s / 2)
    handoff = dict(series.get("rollout/handoff_s", []))
    handoff_s = sum(handoff.get(k, 0.0) for k in steps) / max(tokens / call_tokens, 1.0)
    decode = MeasuredDecode(tokens / busy_s, load_s, handoff_s)
    # Publish → loaded, less the load itself. A stepped mode loads between decode steps,
    # so each latency is a transfer: the simulation draws from them. A drain worker loads
    # between calls, so its latencies also hold the wait for the call in flight, which
    # the simulation makes itself: `fit_transfer` finds the transfer time that gives the
    # measured median back.
    lat_s = [max(0.0, v / 1e3 - decode.load_s) for k, v in series.get("sync/latency_ms", []) if k in steps]
    stepped = cfg.sync.update_mode in STEPPED_MODES
    sync = SyncCost(
        _mean(series, "sync/bytes", steps),
        sync_trainer_s,
        min(lat_s, default=0.0),
        tuple(lat_s) if stepped else (),
    )
    workload = Workload(prompt_tokens=0, median_tokens=length, p90_tokens=length, max_tokens=length)
    ranks = cfg.trainer.num_ranks
    # The half keeps floor(gpus × share) at `workers` whatever the float rounding.
    cluster = Cluster(gpus=workers + ranks, inference_share=(workers + 0.5) / (workers + ranks))
    return Costs(decode, train, sync), workload, cluster


def fit_transfer(
    series: Series, cfg: RunConfig, costs: Costs, workload: Workload, cluster: Cluster, seed: int | None = None
) -> Costs:
    """`costs` with the drain-mode transfer time whose simulated median publish → loaded
    latency is the run's (a bisection: the simulated latency grows with the transfer)."""
    measured = statistics.median(v / 1e3 for _, v in series.get("sync/latency_ms", [(0, 0.0)]))
    steps = max(k for k, _ in series["samples/per_s"])

    def latency(transfer_s: float) -> float:
        c = replace(costs, sync=replace(costs.sync, latency_s=transfer_s))
        lat = [
            v / 1e3
            for _, v in simulate(cfg, cluster, workload, steps=steps, seed=seed, costs=c).series.get(
                "sync/latency_ms", [(0, 0.0)]
            )
        ]
        return statistics.median(lat)

    lo, hi = costs.sync.latency_s, max(measured, costs.sync.latency_s)
    if latency(lo) >= measured:
        return costs
    for _ in range(FIT_ROUNDS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if latency(mid) < measured else (lo, mid)
    return replace(costs, sync=replace(costs.sync, latency_s=(lo + hi) / 2))


def calibrate(series: Series, cfg: RunConfig, seed: int | None = None) -> dict[str, dict[str, float]]:
    """{"measured": figures, "predicted": figures, "costs": what was fed} for `cfg`'s run."""
    costs, workload, cluster = costs_from_run(series, cfg)
    if not costs.sync.latency_draws:
        costs = fit_transfer(series, cfg, costs, workload, cluster, seed)
    steps = max(k for k, _ in series["samples/per_s"])
    sim = simulate(cfg, cluster, workload, steps=steps, seed=seed, costs=costs)
    samples = cfg.trainer.batch_groups * cfg.trainer.group_size
    decode = costs.decode
    assert isinstance(decode, MeasuredDecode) and isinstance(costs.train, MeasuredTrain)
    call_tokens = groups_per_call(cfg.trainer.batch_groups, cfg.inference.num_workers) * cfg.trainer.group_size
    fed = {
        "generate_call_s": call_tokens * workload.median_tokens / decode.tokens_per_s,
        "train_step_s": costs.train.seconds(samples * workload.median_tokens),
        "sync_trainer_s": costs.sync.trainer_s,
        "trainer_overhead_s": costs.train.overhead_s,
        "load_s": decode.load_s,
        "sync_latency_s": costs.sync.latency_s
        if not costs.sync.latency_draws
        else statistics.median(costs.sync.latency_draws),
        "handoff_s": decode.handoff_s,
        "completion_tokens": float(workload.median_tokens),
    }
    return {"measured": steady(series, samples), "predicted": steady(sim.series, samples), "costs": fed}
