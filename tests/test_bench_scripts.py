"""Smoke tests for the bench scripts: they run with tiny settings, print their figures
and refuse bad flags with a message naming the flag. Figures themselves are not
checked against targets here (the host is shared); only that they are there and sane.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
# The engine's tiny-model settings: a run starts in seconds.
TINY = [
    arg
    for kv in (
        "model.hidden_size=16",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.intermediate_size=32",
        "warm_start.steps=2",
        "warm_start.noisy_steps=1",
        "warm_start.batch_size=8",
        "trainer.batch_groups=4",
        "trainer.group_size=4",
    )
    for arg in ("--set", kv)
]


def bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def load(script: str):
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), os.path.join(BENCH, script))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, BENCH)  # pipeline_efficiency imports sync_vs_async from beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(BENCH)
    return module


# ---- buffer_cost -------------------------------------------------------------------


def test_buffer_cost_prints_a_row_per_mode_and_a_verdict(tmp_path):
    out = tmp_path / "cost.json"
    done = bench("buffer_cost.py", "--no-ray", "--batches", "5", "--json", str(out))
    assert done.returncode == 0, done.stderr
    for mode in ("none", "double", "bounded", "unbounded"):
        assert f"in-process {mode} (cap" in done.stdout
    assert "µs per sample (target ≤ 50 µs)" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["verdict"] in ("PASS", "FAIL")
    rows = figures["results"].values()
    assert len(rows) == 4 and all(r["calls"] == 5 * (16 + 1) for r in rows)
    # per group = G × per sample; per sample is positive and finite
    assert all(0 < r["us_per_sample"] < 1e6 and abs(r["us_per_group"] - 8 * r["us_per_sample"]) < 1e-6 for r in rows)


def test_buffer_cost_refuses_an_unknown_mode():
    done = bench("buffer_cost.py", "--no-ray", "--modes", "bounded,ring")
    assert done.returncode != 0
    assert "--modes" in done.stderr and "ring" in done.stderr


def test_buffer_cost_rollouts_look_like_a_runs():
    from workers.config import RunConfig

    cfg = RunConfig()
    groups = load("buffer_cost.py").make_groups(3, cfg)
    for g in groups:
        assert len(g.rollouts) == cfg.trainer.group_size
        for r in g.rollouts:
            assert len(r.completion_ids) == len(r.behaviour_logprobs) == len(r.token_versions)
            assert 1 <= len(r.completion_ids) <= cfg.inference.max_new_tokens


@pytest.mark.slow
def test_buffer_cost_through_ray_prints_put_and_get_per_call():
    done = bench("buffer_cost.py", "--modes", "bounded", "--batches", "3", "--ray-batches", "2", "--ray-warmup", "1")
    assert done.returncode == 0, done.stderr
    assert "Ray BufferActor bounded (cap 2)" in done.stdout
    assert "put " in done.stdout and "get " in done.stdout


# ---- pipeline_efficiency --------------------------------------------------------------


def test_pipeline_efficiency_refuses_bad_flags_before_starting_ray():
    done = bench("pipeline_efficiency.py", "--modes", "sync,turbo")
    assert done.returncode != 0 and "--modes" in done.stderr and "turbo" in done.stderr
    done = bench("pipeline_efficiency.py", "--steps", "2")
    assert done.returncode != 0 and "--steps must be ≥ 3" in done.stderr


def _series(per_step: dict[str, list[float]]) -> dict:
    return {name: [(k + 1, v) for k, v in enumerate(values)] for name, values in per_step.items()}


def test_efficiency_names_the_busier_pool_and_totals_partial_rollouts():
    from workers.config import RunConfig

    pe = load("pipeline_efficiency.py")
    steps = 4
    out = {
        "config": RunConfig(),
        "timings": {},
        "series": _series(
            {
                "samples/per_s": [100.0] * steps,
                "trainer/idle_frac": [0.5, 0.02, 0.02, 0.02],
                "inference/idle_frac": [0.0, 0.3, 0.3, 0.3],
                "trainer/step_s": [0.5] * steps,
                "sync/trainer_ms": [3.0] * steps,
                "sync/bytes": [1e6] * steps,
                "inference/tokens_per_s": [1e3] * steps,
                "staleness/mean": [0.5] * steps,
                "buffer/dropped_stale": [0.0] * steps,
                "reward/mean": [0.1, 0.2, 0.3, 0.4],
                "rollout/partial_aborted": [0.0, 4.0, 9.0, 9.0],  # cumulative
                "rollout/partial_resumed": [0.0, 4.0, 7.0, 7.0],
            }
        ),
    }
    r = pe.efficiency(out)
    assert r["bottleneck"] == "trainer"
    assert r["bottleneck_busy"] == pytest.approx(0.98)  # steps 2..N only
    assert r["inference_busy"] == pytest.approx(0.7)
    assert (r["partial_aborted"], r["partial_resumed"]) == (9.0, 7.0)
    assert "partial_retried" not in r  # no series, no figure


def test_every_mode_builds_a_valid_config():
    from workers.presets import build

    pe = load("pipeline_efficiency.py")
    built = {m: build(preset, extra) for m, (preset, extra) in pe.MODES.items()}
    assert built["sync"].mode == "sync"
    assert built["unbounded"].buffer.mode == "unbounded"
    assert built["in_flight"].sync.update_mode == "in_flight"
    assert built["drain"] == built["bounded"]  # the sweep runs it once


@pytest.mark.slow
def test_pipeline_efficiency_runs_the_engine_and_prints_the_table(tmp_path):
    out = tmp_path / "eff.json"
    done = bench(
        "pipeline_efficiency.py",
        "--modes",
        "sync,bounded,drain",
        "--steps",
        "3",
        *TINY,
        "--json",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[drain] same config as bounded: not run again" in done.stdout
    assert "ideal async/sync ratio" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["ideal"] >= 1.0
    for mode in ("sync", "bounded", "drain"):
        r = figures["modes"][mode]
        assert r["samples_per_s"] > 0 and 0 <= r["bottleneck_busy"] <= 1
    assert figures["modes"]["sync"]["ratio_to_sync"] == 1.0


# ---- weight_sync ----------------------------------------------------------------------


def test_weight_sync_help_names_its_flags():
    done = bench("weight_sync.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "--vllm" in done.stdout and "--cases" in done.stdout
