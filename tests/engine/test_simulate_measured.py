"""The simulator's costs read off a run (workers/simulate/measured.py): a simulated run's
own series, read back as if measured, give back the costs it ran with and its figures.
The same reading of a real run is checked in test_simulate_calibration.py."""

from __future__ import annotations

import numpy as np
import pytest

from workers.config.presets import build
from workers.simulate import Cluster, Workload, simulate
from workers.simulate.costs import Costs, SyncCost
from workers.simulate.measured import FIGURES, MeasuredDecode, MeasuredTrain, calibrate, costs_from_run

LENGTH = 16
WORKLOAD = Workload(prompt_tokens=0, median_tokens=LENGTH, p90_tokens=LENGTH, max_tokens=LENGTH)
TWO = Cluster(gpus=2)  # one inference worker, one trainer rank


def costs(transfer_s: float = 0.0, draws: tuple[float, ...] = ()) -> Costs:
    # A 128-sequence call of 16 tokens in 0.2 s, a step of the same batch in 0.25 s.
    return Costs(
        MeasuredDecode(tokens_per_s=128 * LENGTH / 0.2, load_s=0.002, handoff_s=0.01),
        MeasuredTrain(seconds_per_token=0.25 / (128 * LENGTH)),
        SyncCost(bytes=1e6, trainer_s=0.005, latency_s=transfer_s, latency_draws=draws),
    )


def config(preset: str):
    return build(preset, {"trainer": {"batch_groups": 16, "group_size": 8}})


@pytest.mark.parametrize("preset", ["sync", "async", "nemo-rl", "trl-async"])
def test_a_simulated_runs_series_give_back_its_costs_and_its_figures(preset):
    cfg = config(preset)
    # A stepped mode's latencies are drawn; a drain mode's transfer is one figure.
    ran = simulate(cfg, TWO, WORKLOAD, steps=40, costs=costs(0.03, (0.001, 0.02, 0.2) if preset == "trl-async" else ()))
    read, workload, cluster = costs_from_run(ran.series, cfg)
    assert workload.median_tokens == LENGTH
    assert read.train.seconds(128 * LENGTH) == pytest.approx(0.25, rel=1e-6)
    decode = read.decode
    assert isinstance(decode, MeasuredDecode)
    # Loads are counted as generating time, as a call waits for them: 2 ms each.
    assert 128 * LENGTH / decode.tokens_per_s == pytest.approx(0.2, rel=0.03)
    assert decode.handoff_s == pytest.approx(0.01, rel=0.02)
    assert read.sync.trainer_s == pytest.approx(0.005)
    result = calibrate(ran.series, cfg)
    for name in FIGURES:
        assert result["predicted"][name] == pytest.approx(result["measured"][name], rel=0.05, abs=0.01), name


def test_a_drain_runs_transfer_is_fitted_to_its_measured_latency():
    cfg = config("async")
    ran = simulate(cfg, TWO, WORKLOAD, steps=40, costs=costs(0.05))
    measured = np.median([v for _, v in ran.series["sync/latency_ms"]])
    read, _, _ = costs_from_run(ran.series, cfg)
    assert read.sync.latency_s < 0.05  # the least latency: a worker that was between calls
    result = calibrate(ran.series, cfg)
    assert result["costs"]["sync_latency_s"] == pytest.approx(0.05, rel=0.1)
    assert measured > 50  # the wait for the call in flight is on top of the transfer


def test_a_stepped_run_draws_its_sync_latency_from_the_measured_ones():
    cfg = config("trl-async")
    ran = simulate(cfg, TWO, WORKLOAD, steps=40, costs=costs(0.0, (0.001, 0.3)))
    read, _, _ = costs_from_run(ran.series, cfg)
    assert read.sync.latency_draws and max(read.sync.latency_draws) > 0.2


def test_a_measured_run_refuses_to_guess_a_re_prefill():
    cfg = build("areal", {"trainer": {"batch_groups": 16, "group_size": 8}})
    with pytest.raises(ValueError, match="abort_resume is not calibrated"):
        simulate(cfg, TWO, WORKLOAD, steps=10, costs=costs(0.0))


def test_a_call_of_the_handoff_leaves_the_worker_idle_and_is_reported():
    cfg = config("sync")
    with_handoff = simulate(cfg, TWO, WORKLOAD, steps=20, costs=costs())
    zero = costs()
    without = simulate(
        cfg, TWO, WORKLOAD, steps=20, costs=Costs(MeasuredDecode(128 * LENGTH / 0.2, 0.002, 0.0), zero.train, zero.sync)
    )
    assert sum(v for _, v in with_handoff.series["rollout/handoff_s"]) == pytest.approx(20 * 0.01)
    assert with_handoff.summary["seconds"] == pytest.approx(without.summary["seconds"] + 20 * 0.01, rel=1e-6)
