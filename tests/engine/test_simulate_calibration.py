"""The simulator against measured runs: a preset run on the real engine (in-process Ray,
the run driver and its actors), then simulated with the costs that run measured
(workers/simulate/measured.py), predicts that run's samples/s within 10%, the trainer's
and the inference pool's idle shares within 10 points of the wall time, and (where weights
are taken between calls) its mean staleness within 10%.

The runs are recordings (tests/engine/data/calibration/<preset>.json: each run's config
and series), replayed here. A run's figures depend on how busy the host is while it runs,
so a live run inside the suite, beside the other worker's runs, measures the suite as
much as the simulator; a recording makes the check exact and repeatable. They were
recorded on this project's 2-core machine, alone, by

    .venv/bin/python bench/simulate_calibration.py \\
        --presets sync,async,tunix,trl-async,nemo-rl,pipelinerl \\
        --set task.min_len=12 --set task.max_len=20 --set inference.max_new_tokens=24 \\
        --set warm_start.steps=20 --series tests/engine/data/calibration

(reversals of 12–20 letters: a generate call and a training step of ~0.1–0.3 s each, so a
step is mostly the work the cost models price, not Ray's calls), and the in-flight
presets again with the trainer made the slower pool (four minibatches a step) by

    .venv/bin/python bench/simulate_calibration.py --presets trl-async,pipelinerl,skyrl \\
        --set task.min_len=12 --set task.max_len=20 --set inference.max_new_tokens=24 \\
        --set warm_start.steps=20 --set trainer.minibatches=4 \\
        --series tests/engine/data/calibration --suffix +trainer-bound The same command
without `--series` prints the live table; tests/test_bench_scripts.py runs it on two
short presets, so the path from a live run's series to the simulator stays exercised. A
config change that a recording no longer validates against fails here, naming the file:
record again.

Where weights are taken mid-call (in_flight) and the gate lets inference run several
batches ahead, the staleness is the lead inference builds up over the run. With the two
pools equal within a few percent, that lead is the difference of two nearly equal rates,
which mean costs cannot pin (measured against predicted: −2% to −34% over two runs of
each, docs/simulation.md): such a recording is checked for its rate and idle shares only.
With the trainer clearly the slower pool (the `+trainer-bound` recordings, their
inference waiting a third of the time or more), the lead reaches what the gate allows,
and the staleness is checked as everywhere else."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from workers.config.run_config import RunConfig
from workers.rollout.partial_rollouts import STEPPED_MODES
from workers.simulate import published
from workers.simulate.costs import NVLINK, TRAIN_MFU
from workers.simulate.measured import FIGURES, calibrate

RECORDINGS = Path(__file__).parent / "data" / "calibration"
PRESETS = ("sync", "async", "tunix", "trl-async", "nemo-rl", "pipelinerl")
# The in-flight presets with the trainer the slower pool (trainer.minibatches 4).
TRAINER_BOUND = ("trl-async+trainer-bound", "pipelinerl+trainer-bound", "skyrl+trainer-bound")


def recording(name: str) -> tuple[dict, RunConfig]:
    path = RECORDINGS / f"{name}.json"
    data = json.loads(path.read_text())
    try:
        cfg = RunConfig.model_validate(data["config"])
    except ValueError as exc:
        raise AssertionError(f"{path} no longer validates as a RunConfig: record it again ({exc})") from exc
    series = {name: [(int(step), float(v)) for step, v in points] for name, points in data["series"].items()}
    return series, cfg


def test_every_recording_is_a_whole_run_of_its_preset():
    assert sorted(p.stem for p in RECORDINGS.glob("*.json")) == sorted(PRESETS + TRAINER_BOUND)
    for name in PRESETS + TRAINER_BOUND:
        series, cfg = recording(name)
        steps = sorted(step for step, _ in series["samples/per_s"])
        assert steps == list(range(1, cfg.stop.max_steps + 1)), name
        assert cfg.stop.max_steps >= 20 and cfg.task.min_len == 12, name
        if name in TRAINER_BOUND:
            assert cfg.trainer.minibatches == 4 and cfg.sync.update_mode in STEPPED_MODES, name
            assert cfg.buffer.max_head_offpolicyness and cfg.buffer.max_head_offpolicyness > 1, name


@pytest.mark.parametrize("name", PRESETS + TRAINER_BOUND)
def test_the_simulator_given_a_runs_costs_predicts_its_figures(name):
    series, cfg = recording(name)
    result = calibrate(series, cfg)
    measured, predicted = result["measured"], result["predicted"]
    assert set(measured) == set(predicted) == set(FIGURES)
    report = f"{name}: measured {measured}, predicted {predicted}, costs {result['costs']}"
    assert predicted["samples/per_s"] == pytest.approx(measured["samples/per_s"], rel=0.10), report
    for idle in ("trainer/idle_frac", "inference/idle_frac"):
        assert predicted[idle] == pytest.approx(measured[idle], abs=0.10), report
    if name in TRAINER_BOUND:
        # The trainer is the slower pool by a margin the staleness rests on, as measured,
        # and the staleness is the lead the gate allows, beyond the one version of a run
        # that takes weights between calls.
        assert measured["inference/idle_frac"] >= 0.3 and measured["staleness/mean"] > 1.5, report
    if cfg.sync.update_mode not in STEPPED_MODES or name in TRAINER_BOUND:
        assert predicted["staleness/mean"] == pytest.approx(measured["staleness/mean"], rel=0.10, abs=0.02), report


def test_the_simulator_tells_a_slower_trainer_apart():
    """The check can fail: the async run's recording with its training steps made 3×
    slower is no longer predicted by the figures it measured."""
    series, cfg = recording("async")
    honest = calibrate(series, cfg)["predicted"]["samples/per_s"]
    slow = {**series, "trainer/step_s": [(k, 3 * v) for k, v in series["trainer/step_s"]]}
    assert calibrate(slow, cfg)["predicted"]["samples/per_s"] < 0.8 * honest


def test_a_trainer_bound_runs_staleness_rests_on_the_gate_it_ran_under():
    """The staleness check can fail: the trainer-bound trl-async recording simulated with
    a gate that lets inference run one batch ahead, not four, is no longer predicted."""
    series, cfg = recording("trl-async+trainer-bound")
    measured = calibrate(series, cfg)["measured"]["staleness/mean"]
    tighter = cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"max_head_offpolicyness": 1})})
    assert calibrate(series, tighter)["predicted"]["staleness/mean"] < 0.6 * measured


# ---- the peers' published figures (workers/simulate/published.py) --------------------
#
# verl's fully-async recipe, AReaL v0.3 and verl's checkpoint engine, rebuilt as
# scenarios: a few constants are fitted on some figures (published.FIT on verl's 128-GPU
# runs, the inter-node link on the 30B-A3B sync pair) and every other figure is
# predicted. The predictions that hold are held within 20%; those that do not are
# expected to miss (docs/simulation.md says why), strictly, so a change that mends one
# shows here.

HELD = (
    "fully async 16:16 time per step: 1d 9h 26m / 400",
    "fully async 32:32 over colocate sync",
    "staleness 0 → 0.1: total time 1d 1h 53m → 19h 59m",
    "staleness 0 → 0.3: total time 1d 1h 53m → 17h 20m",
    "colocate sync step at 64 GPUs",
    "async over sync AReaL: 41.0 → 14.8 h",
    "weight sync, per tensor|Qwen2.5-Math-7B",
    "weight sync, per tensor|Qwen3-235B-A22B",
)
MISSED = (
    "fully async 16:16 over colocate sync",
    "staleness 0 → 0.5: total time 1d 1h 53m → 17h 22m",
    "colocate sync step at 32 GPUs",
    "async over sync AReaL: 57.7 → 25.4 h",
    "weight sync, checkpoint engine|Qwen2.5-Math-7B",
    "weight sync, checkpoint engine|Qwen3-235B-A22B",
)


def find(table: list[published.Row], key: str) -> published.Row:
    figure, _, scenario = key.partition("|")
    (row,) = [r for r in table if r.figure == figure and r.scenario.startswith(scenario)]
    return row


@pytest.fixture(scope="module")
def table() -> list[published.Row]:
    return published.rows()


def test_every_published_figure_is_fitted_held_or_an_expected_miss(table):
    predicted = {f"{r.figure}|{r.scenario.split(',')[0]}" for r in table if not r.fitted and r.simulated is not None}
    named = {find(table, key) for key in HELD + MISSED}
    assert {f"{r.figure}|{r.scenario.split(',')[0]}" for r in named} == predicted
    assert [r.figure for r in table if r.simulated is None] == [published.MOE_V1_ROW.figure]


@pytest.mark.parametrize("key", HELD)
def test_a_held_out_prediction_is_within_20_percent(table, key):
    row = find(table, key)
    assert not row.fitted
    assert row.ratio == pytest.approx(1.0, abs=0.2), row


@pytest.mark.parametrize("key", MISSED)
@pytest.mark.xfail(strict=True, reason="a known miss: docs/simulation.md, Calibration, says why")
def test_a_missed_prediction_is_still_missed(table, key):
    assert find(table, key).ratio == pytest.approx(1.0, abs=0.2)


def test_the_fitted_figures_are_within_20_percent(table):
    for row in (r for r in table if r.fitted):
        assert row.ratio == pytest.approx(1.0, abs=0.2), row


def test_the_held_out_checks_fail_with_other_constants():
    """The checks can fail: the staleness ablation, the 64-GPU colocated step and the
    16:16 trainer's step with the H100-class training MFU in place of the fitted one,
    staleness 0.1 with a gate that admits nothing for verl's sync interval, the 32:32
    speed-up with completions' p90 at twice their median (not five times), AReaL's 1.5B
    speed-up with completions four times as long, the 235B per-tensor sync with the
    NVLink's message latency in place of the fitted link's, the 7B per-tensor sync over
    the fitted inter-node link in place of one node's NVLink."""
    fit = published.FIT
    slow = dataclasses.replace(fit, h20_train_mfu=TRAIN_MFU)
    ablation = (
        published.verl_async(128, 0.3, slow)["samples_per_s"] / published.verl_async(128, 0.0, slow)["samples_per_s"]
    )
    assert abs(ablation / (1553 / 1040) - 1) > 0.2
    sync64 = published.verl_sync(64, slow)
    assert abs(sync64["seconds"] / sync64["steps"] / 365.28 - 1) > 0.2
    async16 = published.verl_async(32, 0.5, slow)
    assert abs(published.VERL_PROMPTS * published.VERL_GROUP / async16["samples_per_s"] / (2006 * 60 / 400) - 1) > 0.2
    plain = [published.verl_async(128, staleness, ahead=0)["samples_per_s"] for staleness in (0.1, 0.0)]
    assert abs(plain[0] / plain[1] / (1553 / 1199) - 1) > 0.2
    narrow = dataclasses.replace(fit, p90_tokens=2 * fit.median_tokens)
    x = published.verl_async(64, 0.5, narrow)["samples_per_s"] / published.verl_sync(64, narrow)["samples_per_s"]
    assert abs(x / (2492 / 1300) - 1) > 0.2
    long = dataclasses.replace(fit, median_tokens=4 * fit.median_tokens, p90_tokens=4 * fit.p90_tokens)
    assert abs(published.areal_speedup("R1-Distill-Qwen-1.5B", 16, long) / (41.0 / 14.8) - 1) > 0.2
    fitted = published.fit_sync_link()
    shape = published.model("Qwen3-235B-A22B")
    other = dataclasses.replace(fitted, latency_s=NVLINK.latency_s)
    assert abs(published._sync_seconds(shape, other, bucketed=False) / 58.57 - 1) > 0.2
    assert published._sync_seconds(shape, fitted, bucketed=False) == pytest.approx(58.57, rel=0.2)
    small = published.model("Qwen2.5-Math-7B")
    assert abs(published._sync_seconds(small, fitted, bucketed=False) / 0.12 - 1) > 0.2
    assert published._sync_seconds(small, NVLINK, bucketed=False) == pytest.approx(0.12, rel=0.2)


def test_the_checkpoint_engine_broadcasts_each_ranks_buckets_in_turn():
    """verl's checkpoint engine: each trainer rank packs its round-robin share of the
    tensors into 4 GB buckets (the default device_buffer_size_M), one broadcast each."""
    figures = published.SYNC_FIGURES
    counts = {name: published._buckets(published.model(name).params * 2, ranks) for name, ranks, *_ in figures}
    assert counts == {"Qwen2.5-Math-7B": 4, "Qwen3-30B-A3B": 16, "Qwen3-235B-A22B": 128}
    shape, link = published.model("Qwen3-235B-A22B"), published.fit_sync_link()
    one = published._sync_seconds(shape, link, bucketed=True, ranks=1)
    many = published._sync_seconds(shape, link, bucketed=True, ranks=64)
    # The same bytes cross the link one sender at a time: only the message count grows.
    whole = published._buckets(shape.params * 2, 1)  # one sender: 110 buckets of 4 GB
    assert many - one == pytest.approx((128 - whole) * link.latency_s)


@pytest.mark.slow  # 27 simulated pairs of runs: tens of seconds
def test_the_fitted_constants_are_what_the_fit_finds():
    assert published.fit_verl(medians=(500, 700, 1000), p90_over_median=(4, 5, 6)) == published.FIT
