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
import time

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
    # As importlib's recipe does: a dataclass of the module looks its annotations up there.
    sys.modules[spec.name] = module
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
    from workers.config.run_config import RunConfig

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
@pytest.mark.slow  # a subprocess importing Ray and torch: not for the inner loop
def test_pipeline_efficiency_refuses_bad_flags_before_starting_ray():
    done = bench("pipeline_efficiency.py", "--modes", "sync,turbo")
    assert done.returncode != 0 and "--modes" in done.stderr and "turbo" in done.stderr
    done = bench("pipeline_efficiency.py", "--steps", "2")
    assert done.returncode != 0 and "--steps must be ≥ 3" in done.stderr


def _series(per_step: dict[str, list[float]]) -> dict:
    return {name: [(k + 1, v) for k, v in enumerate(values)] for name, values in per_step.items()}


def test_efficiency_names_the_busier_pool_and_totals_partial_rollouts():
    from workers.config.run_config import RunConfig

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
    from workers.config.presets import build

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


@pytest.mark.slow  # a subprocess importing Ray and torch: not for the inner loop
def test_episode_stragglers_refuses_an_unknown_layout_naming_the_flag():
    done = bench("episode_stragglers.py", "--layouts", "barrier,fastest")
    assert done.returncode != 0 and "--layouts" in done.stderr and "fastest" in done.stderr


@pytest.mark.slow
def test_episode_stragglers_runs_each_layout_and_prints_the_straggler_table(tmp_path):
    out = tmp_path / "stragglers.json"
    done = bench(
        "episode_stragglers.py",
        "--presets",
        "sync",
        "--layouts",
        "barrier,overcommit",
        "--steps",
        "3",
        "--median-s",
        "0.01",
        "--overcommit",
        "2",
        *TINY,
        "--set",
        "warm_start.lr=3e-3",
        "--json",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sync barrier" in done.stdout and "sync overcommit" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert results["sync barrier"]["late_per_step"] == 0.0  # a synchronous barrier trains nothing late
    for r in results.values():
        e = r["episodes"]
        assert e["episode/p90_s"] >= e["episode/p50_s"] > 0 and r["samples_per_s"] > 0


# ---- peer_trl (pure parts: the TRL side needs its own venv and minutes) ----------------


def test_peer_trl_refuses_bad_flags_naming_them():
    for args, needle in (
        (["--steps", "2"], "--steps must be ≥ 3"),
        (["--target", "1.5"], "--target must be in (0, 1]"),
        (["--group-size", "1"], "--group-size must be ≥ 2"),
        (["--length", "64", "--max-new-tokens", "64"], "--max-new-tokens (64) must be ≥ --length + 1 (65)"),
        (["--backends", "torch,tgi"], "--backends"),
        (["--skip-trl", "--skip-rollway"], "leave nothing to run"),
        (["--set", "trainer.lr"], "--set 'trainer.lr': write it as field.path=value"),
    ):
        done = bench("peer_trl.py", *args)
        assert done.returncode != 0 and needle in done.stderr, (args, done.stderr[-500:])


def test_peer_trl_quick_is_small():
    pt = load("peer_trl.py")
    args = pt.parse_args(["--quick"])
    assert (args.steps, args.batch_groups, args.group_size) == (4, 4, 4)
    assert args.max_new_tokens >= 64  # still generation-heavy


def test_peer_trl_seeds_share_one_checkpoint_and_set_overrides_the_rollway_sides():
    pt = load("peer_trl.py")
    args = pt.parse_args(["--seed", "2", "--set", "placement.cpu_threads=2", "--set", "trainer.lr=1e-4"])
    assert (args.seed, args.checkpoint_seed) == (2, 0)  # the RL's seed moves, the start does not
    overrides = pt.rollway_overrides(args, "torch", "/policy")
    assert overrides["seed"] == 2 and overrides["placement"] == {"cpu_threads": 2}
    assert overrides["trainer"] == {"lr": 1e-4, "batch_groups": 8, "group_size": 8}  # --set wins, the rest kept


def test_peer_trl_window_is_the_engines_reward_window():
    from workers.core.metric_names import REWARD_WINDOW

    assert load("peer_trl.py").WINDOW == REWARD_WINDOW


def test_peer_trl_moving_mean_and_time_to_target():
    pt = load("peer_trl.py")
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.9]
    times = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    means = pt.moving_mean(rewards, 5)
    assert means[:4] == [None] * 4
    assert means[4] == pytest.approx(0.3) and means[5] == pytest.approx(0.46)
    assert pt.time_to_target(rewards, times, 0.45, window=5) == (6, 6.0)
    assert pt.time_to_target(rewards, times, 0.9, window=5) is None
    # one step over the target is not enough: the mean of the window must be
    assert pt.time_to_target([0.0, 0.0, 0.0, 0.0, 1.0], times[:5], 0.5, window=5) is None


def test_peer_trl_figures_skip_step_one_and_split_busy_time():
    pt = load("peer_trl.py")
    # 3 steps of 8 samples: step 1 ends at 10 s (first generation), then 2 s a step.
    r = pt.figures([10.0, 12.0, 14.0], [0.2, 0.4, 0.6], 8, [500, 400, 400], [9, 1.5, 1.0], [1, 0.5, 0.5], 0.5)
    assert r["samples_per_s"] == pytest.approx(2 * 8 / 4.0)
    assert r["tokens_per_s"] == pytest.approx(800 / 4.0)
    assert r["tokens_per_sample"] == pytest.approx(1300 / 24)
    assert r["inference_busy"] == pytest.approx(2.5 / 4.0) and r["trainer_busy"] == pytest.approx(0.25)
    assert r["reward_start"] == pytest.approx(0.4) and r["target_s"] is None  # 3 steps < window


def test_peer_trl_rollway_step_ends_are_summed_windows():
    pt = load("peer_trl.py")
    series = _series(
        {
            "samples/per_s": [8.0, 16.0, 16.0],  # windows 1, 0.5, 0.5 s for 8 samples
            "reward/mean": [0.1, 0.2, 0.3],
            "inference/tokens_per_s": [100.0, 200.0, 200.0],
            "inference/idle_frac": [0.0, 0.5, 0.5],
            "trainer/idle_frac": [1.0, 0.2, 0.2],
            "trainer/step_s": [0.4, 0.4, 0.4],
            "buffer/dropped_stale": [0.0, 1.0, 2.0],
        }
    )
    r = pt.rollway_figures(series, 8, 0.9)
    assert r["wall_s"] == pytest.approx(2.0) and r["samples_per_s"] == pytest.approx(16.0)
    assert r["tokens_per_s"] == pytest.approx(200.0)
    assert r["inference_busy"] == pytest.approx(0.5) and r["trainer_busy"] == pytest.approx(0.8)
    assert r["dropped_stale"] == 2.0


def test_peer_trl_table_prints_a_dash_for_what_is_missing_and_the_verdict_names_the_target():
    pt = load("peer_trl.py")
    row = {key: 1.0 for _, key, _ in pt.ROWS} | {"target_s": None, "target_step": None}
    fast = dict(row, samples_per_s=3.5, target_s=2.0, target_step=4)
    table = pt.format_table({"trl": row, "async": fast})
    lines = table.splitlines()
    assert lines[0].split() == ["trl", "async"]
    assert len(lines) == 1 + len(pt.ROWS)
    target_line = next(line for line in lines if line.startswith("time to target (s)"))
    assert target_line.split()[-2:] == ["-", "2.0"]
    (line,) = pt.verdict({"trl": dict(row, target_s=5.0), "async": fast}, 0.5)
    assert "3.50× (target ≥ 2×: met)" in line and "2.0s vs TRL 5.0s (less)" in line
    (line,) = pt.verdict({"trl": row, "async": dict(fast, samples_per_s=1.9)}, 0.5)
    assert "NOT met" in line and "reached by async" in line


def test_peer_trl_runner_reward_is_the_tasks():
    import random

    from workers.config.run_config import TaskConfig
    from workers.rl_tasks import make_task

    runner = load("peer_trl_runner.py")
    rng = random.Random(0)
    for kind in ("exact", "prefix", "position"):
        task = make_task(TaskConfig(name="copy", min_len=1, max_len=8, alphabet="abc", reward=kind))
        for _ in range(300):
            answer = "".join(rng.choice("abc") for _ in range(rng.randint(1, 8)))
            completion = "".join(rng.choice("abc") for _ in range(rng.randint(0, 10)))
            assert runner.reward(completion, answer, kind) == task.reward(completion, answer)


def test_peer_trl_prompts_are_the_inference_workers():
    import random

    from workers.config.run_config import TaskConfig
    from workers.rl_tasks import make_task

    pt = load("peer_trl.py")
    args = pt.parse_args(["--quick", "--seed", "3"])
    prompts = pt.prompts_in_order(args, 6)
    # workers/run/actors.py: one generator per worker, drawn batch after batch
    rng = random.Random("3-prompts-0")
    task = make_task(TaskConfig(**pt.task_section(args)))
    expected = task.sample(2, rng) + task.sample(4, rng)
    assert [(p["prompt"], p["answer"]) for p in prompts] == expected
    assert all(p["answer"] == p["prompt"][:-1] and len(p["answer"]) == args.length for p in prompts)


# ---- weight_sync ----------------------------------------------------------------------


# ---- generation ---------------------------------------------------------------------


def test_generation_prints_each_side_of_each_model_against_generate(monkeypatch, capsys):
    generation = load("generation.py")
    for name, value in (("B", 2), ("G", 2), ("PROMPT", 6), ("MAX_NEW", 4)):
        monkeypatch.setattr(generation, name, value)
    monkeypatch.setattr(sys, "argv", ["generation.py", "--repeats", "1", "--llama"])
    torch_threads = __import__("torch").get_num_threads()
    try:
        assert generation.main() == 0
    finally:
        __import__("torch").set_num_threads(torch_threads)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny")]
    sides = ("hand-written", "transformers forward", "transformers generate")
    assert [r.split(" | ")[:2] for r in rows] == [[f"| tiny {m}", s] for m in ("qwen2", "llama") for s in sides]
    assert all(float(r.split(" | ")[2].replace(",", "")) > 0 for r in rows)
    assert [r.split(" | ")[3] for r in rows if "generate" in r] == ["1.00× |", "1.00× |"]


@pytest.mark.slow  # it trains: not for the inner loop
def test_keep_records_trains_each_switch_in_the_dtype_asked_without_sizes():
    # --train-only needs no Ray (a GPU host may lack it): four rows, one per switch.
    done = bench(
        "keep_records.py",
        *("--train-only", "--staleness", "0", "--seeds", "0", "--steps", "1", "--warm-start", "0"),
        *("--batch-groups", "2", "--group-size", "2", "--max-new-tokens", "4", "--dtype", "bfloat16"),
    )
    assert done.returncode == 0, done.stderr
    assert "bfloat16 on cpu" in done.stdout and "Ray object store" not in done.stdout
    rows = [line.split(" | ")[:3] for line in done.stdout.splitlines() if line.startswith("| 0 | ")]
    assert rows[:4] == [["| 0", a, b] for a, b in (("off", "off"), ("on", "off"), ("off", "on"), ("on", "on"))]


def test_weight_sync_help_names_its_flags():
    done = bench("weight_sync.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "--vllm" in done.stdout and "--cases" in done.stdout


# ---- load benches: ws_fanout, ingest_load, soak -------------------------------------------

# Well-formed settings for flag checks that must fail before anything connects.
SITE = ("--database-url", "postgres://nobody@127.0.0.1:1/none", "--redis-url", "redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    ("script", "args", "names"),
    [
        ("ws_fanout.py", ["--viewers", "0", *SITE], ["--viewers"]),
        ("ws_fanout.py", ["--database-url", "sqlite:///x.db", "--redis-url", "redis://h/0"], ["--database-url"]),
        ("ws_fanout.py", [*SITE, "--url", "127.0.0.1:8000"], ["--url", "http://"]),
        ("ingest_load.py", ["--database-url", "postgres://h/db", "--redis-url", ""], ["--redis-url"]),
        ("ingest_load.py", ["--series", "1000", "--steps", "100", *SITE], ["--series × --steps"]),
        ("ingest_load.py", [*SITE, "--site-env", "ROLLWAY_MAX_POINTS_PER_SERIES"], ["--site-env", "NAME=VALUE"]),
        ("soak.py", ["--minutes", "1", "--interval", "90", *SITE], ["--interval", "--minutes"]),
        ("soak.py", ["--viewers", "-1", *SITE], ["--viewers"]),
    ],
)
def test_load_benches_refuse_bad_flags_naming_them(script, args, names):
    done = bench(script, *args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    for name in names:
        assert name in done.stderr


def _points_message(points: list[dict]) -> str:
    return json.dumps({"type": "points", "points": points})


def test_fanout_names_each_viewer_that_missed_or_doubled_a_step():
    fanout = load("ws_fanout.py")
    names = fanout.series_names(3)
    watched = frozenset(names)
    viewers = [fanout.loadsite.Viewer(i) for i in range(3)]
    for step in (1, 2, 3):
        points = fanout.batch(names, step, 1000.0 + step)["points"]
        arrived = 1000.0 + step + 0.125
        for v in viewers:
            if not (v.index == 1 and step == 2):  # viewer 1 never gets step 2
                v.take(_points_message(points), arrived, watched)
        if step == 3:  # viewer 2 gets step 3 twice
            viewers[2].take(_points_message(points), arrived, watched)
    accepted = {1: 3, 2: 3, 3: 3}
    assert fanout.missed(viewers, accepted) == {1: [2]}
    assert fanout.doubled(viewers, accepted) == {2: [3]}
    assert viewers[0].latency_by_step == pytest.approx({1: 0.125, 2: 0.125, 3: 0.125})
    assert (viewers[0].messages, viewers[0].points, viewers[1].points) == (3, 9, 6)
    # A point of a series the bench never posts (another run on the same group) is not
    # counted as this run's, and a status message is no points message.
    viewers[0].take(_points_message([{"series": "reward/mean", "step": 9, "value": 1.0, "time": 0.0}]), 1.0, watched)
    viewers[0].take(json.dumps({"type": "status", "run": {}}), 1.0, watched)
    assert (viewers[0].foreign, viewers[0].points, 9 in viewers[0].by_step) == (1, 9, False)
    assert viewers[0].messages == 4


def test_load_summary_percentiles_are_exact_at_small_n():
    loadsite = load("loadsite.py")
    s = loadsite.summary([float(x) for x in range(101, 0, -1)])
    assert (s["n"], s["p50"], s["p95"], s["p99"], s["max"]) == (101, 51, 96, 100, 101)
    assert loadsite.summary([0.2])["p95"] == 0.2
    assert loadsite.summary([])["n"] == 0
    assert "p95 250 ms" in loadsite.ms({"p50": 0.1, "p95": 0.25, "p99": 0.3, "max": 1.0})


def test_ingest_load_batches_are_what_the_ingest_takes_and_windows_bin_them():
    from api.ingest import METRICS_IN
    from workers.core.metric_names import NAMES

    ingest = load("ingest_load.py")
    names = ingest.series_names(30)
    assert len(names) == 30 and set(names) <= set(NAMES)  # the engine's own series
    assert len(set(ingest.series_names(40))) == 40
    points = METRICS_IN.validate_json(ingest.batch(names, 10, 5))["points"]
    assert len({(p["series"], p["step"]) for p in points}) == len(points) == 150
    assert {p["step"] for p in points} == set(range(10, 15))
    # (finished at, latency, status, accepted): binned by when each request finished
    log = [(0.5, 0.1, 200, 100), (0.9, 0.1, 200, 20), (1.5, 0.1, 200, 50), (2.5, 0.1, 200, 30), (3.5, 0.1, 200, 99)]
    assert ingest.windows(log, 0.0, 3.0, 1.0) == [120.0, 50.0, 30.0]
    assert ingest.windows(log, 1.0, 3.0, 2.0) == [40.0]


def test_soak_drift_is_last_minus_first_and_per_minute():
    soak = load("soak.py")
    base = {
        "web_rss_mb": 100.0,
        "worker_rss_mb": 200.0,
        "ray_rss_mb": 900.0,
        "ray_procs": 12,
        "web_fds": 40,
        "worker_fds": 30,
        "db_conns": 3,
        "redis_mb": 1.5,
        "redis_keys": 4,
        "run_pts_s": 50.0,
        "all_pts_s": 350.0,
        "ws_msgs": 100,
        "run_ms": 20.0,
        "metrics_ms": 40.0,
        "compare_ms": 30.0,
    }
    first = soak.Sample(t_min=0.5, **base)
    last = soak.Sample(t_min=5.5, **{**base, "web_rss_mb": 110.0, "web_fds": 45})
    figures = {title: rest for title, *rest in soak.drift([first, soak.Sample(t_min=3, **base), last])}
    assert figures["web MB"] == pytest.approx([100.0, 110.0, 10.0, 2.0])
    assert figures["web fd"] == pytest.approx([40, 45, 5, 1.0])
    assert figures["wrk MB"] == pytest.approx([200.0, 200.0, 0.0, 0.0])
    assert len(soak.header()) == len(soak.row(last))  # the table's columns line up


def test_soak_takes_one_sample_per_interval_however_long_each_takes():
    soak = load("soak.py")
    assert soak.samples_in(0.25, 5) == 3  # 15 s: at 5, 10 and 15 s
    assert soak.samples_in(30, 30) == 60
    assert soak.samples_in(0.1, 5) == 1
    assert soak.samples_in(0.2, 5) == 2  # 12 s: a third sample would fall past the end


def test_soak_names_the_ray_processes_that_grew_most():
    soak = load("soak.py")
    first = {1: ("raylet", 30.0), 2: ("ray::RunDriver", 300.0), 3: ("ray::TrainerActor", 400.0), 4: ("gone", 5.0)}
    last = {1: ("raylet", 31.0), 2: ("ray::RunDriver", 380.0), 3: ("ray::TrainerActor", 395.0), 5: ("new", 9.0)}
    assert soak.ray_growth(first, last) == [
        (2, "ray::RunDriver", 300.0, 380.0),
        (1, "raylet", 30.0, 31.0),
        (3, "ray::TrainerActor", 400.0, 395.0),
        (5, "new", None, 9.0),
        (4, "gone", 5.0, None),
    ]


def test_soak_compares_viewers_over_the_messages_both_were_reading():
    soak = load("soak.py")
    early = [1, 2, 3, 4, 5, 6]
    late = [3, 4, 5, 6]  # joined last: messages 1 and 2 went out before it did
    lossy = [2, 3, 5, 6]  # lost message 4 while the others read it
    stopped = [1, 2, 3, 4]  # stopped reading before 5 and 6 arrived
    assert soak.lost_frames([early, late, lossy, stopped]) == {2: 1}
    assert soak.lost_frames([early, []]) == {1: 6}  # a viewer that got nothing lost all
    assert soak.lost_frames([early, late]) == {}


def _database_urls(name: str) -> tuple[str, str]:
    """(the server's maintenance database, database `name`) beside $DATABASE_URL's."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/postgres")), urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def migrated_bench_template(tmp_path_factory):
    """A database migrated once per session, which each bench test's database copies
    (CREATE DATABASE … TEMPLATE takes a fraction of a second; a migrate takes seconds)."""
    import uuid

    url, redis = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not redis.startswith("redis://"):
        pytest.skip("needs DATABASE_URL (PostgreSQL) and REDIS_URL: `make test` sets them")
    import psycopg

    name = f"bench_tpl_{uuid.uuid4().hex[:12]}"
    admin, database = _database_urls(name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DATABASE_URL": database, "ROLLWAY_HOME": str(tmp_path_factory.mktemp("bench-tpl"))}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True, timeout=600
        )
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def bench_database(migrated_bench_template):
    """A throwaway PostgreSQL database beside $DATABASE_URL's, migrated, with run and team
    ids far above any test database's: the benches share $REDIS_URL's channel layer with
    other tests' sites, whose run groups ("run-<id>") and run-list watchers (filtered by
    team id) must not meet theirs."""
    import uuid

    import psycopg

    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin, database = _database_urls(name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_bench_template}"')
    try:
        with psycopg.connect(database, autocommit=True) as c:
            for table in ("runs_run", "teams_team"):
                c.execute(f"ALTER TABLE {table} ALTER COLUMN id RESTART WITH {10**9 + uuid.uuid4().int % 10**8}")
        yield database, os.environ["REDIS_URL"]
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _runs_left(database: str) -> int:
    import psycopg

    with psycopg.connect(database) as c:
        return c.execute("SELECT count(*) FROM runs_run").fetchone()[0]


@pytest.mark.slow
def test_ws_fanout_times_every_point_to_every_viewer(bench_database, tmp_path):
    database, redis = bench_database
    out = tmp_path / "fanout.json"
    done = bench(
        "ws_fanout.py",
        *("--viewers", "3", "--seconds", "2", "--rate", "5", "--series", "4"),
        *("--database-url", database, "--redis-url", redis, "--json", str(out)),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "emit→receive latency" in done.stdout and "viewers that missed points: none" in done.stdout
    f = json.loads(out.read_text())
    assert f["connected"] == 3 and f["posts"] == f["accepted_posts"] == 10
    assert f["deliveries"] == 3 * 10 and not f["missed"] and not f["doubled"] and not f["errors"]
    assert f["messages_per_viewer"] == {"min": 10, "median": 10, "max": 10}
    assert 0 < f["latency"]["p50"] <= f["latency"]["p95"] <= f["latency"]["max"] < 60
    assert _runs_left(database) == 0  # without --keep the bench removes its run


@pytest.mark.slow
def test_ingest_load_stores_exactly_what_it_accepted_and_profiles_a_request(bench_database, tmp_path):
    database, redis = bench_database
    out = tmp_path / "ingest.json"
    done = bench(
        "ingest_load.py",
        *("--runs", "2", "--seconds", "3", "--warmup", "1", "--series", "10", "--steps", "2", "--profile", "5"),
        *("--database-url", database, "--redis-url", redis, "--json", str(out), "--keep"),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "accepted points/s" in done.stdout and "consistent" in done.stdout
    f = json.loads(out.read_text())
    assert f["errors"] == {} and f["requests"] > 0 and f["points"] == 20 * f["requests"]
    assert f["points_per_s"] == pytest.approx(f["points"] / 3)
    assert f["stored"] == f["rollup_counted"] == f["accepted_total"] > f["points"]  # warm-up points too
    phases = dict(f["profile"]["phases"])
    assert phases["whole view (ingest_metrics)"] >= phases["  rollups (runs/rollups.py refresh)"] > 0
    assert _runs_left(database) == 2  # --keep kept them; the fixture drops the database


@pytest.mark.slow
def test_soak_samples_a_real_run_through_the_whole_site(bench_database, tmp_path):
    database, redis = bench_database
    out = tmp_path / "soak.json"
    done = bench(
        "soak.py",
        # Three samples 2 s apart: enough for drift (first → last) and for every column to
        # have moved (the pages' reads come four times a sample); the sampling window is
        # not what this test checks, and the run trains on both cores all through it.
        *("--minutes", "0.1", "--interval", "2", "--read-every", "0.5"),
        *("--viewers", "2", "--extra-points-per-s", "60"),
        # The embedded broker: a worker on the suite's broker would take other tests' tasks.
        *("--database-url", database, "--redis-url", redis, "--broker-url", "filesystem://", "--json", str(out)),
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "drift (first sample → last):" in done.stdout
    f = json.loads(out.read_text())
    samples = f["samples"]
    assert len(samples) == 3 and f["run_status"] == "running" and not f["errors"]
    for s in samples:
        assert s["web_rss_mb"] > 10 and s["worker_rss_mb"] > 10 and s["ray_rss_mb"] > 10
        assert s["web_fds"] > 0 and s["worker_fds"] > 0 and s["db_conns"] >= 0
        assert s["all_pts_s"] >= s["run_pts_s"] >= 0 and s["run_ms"] > 0 and s["metrics_ms"] > 0
    assert sum(s["all_pts_s"] for s in samples) > 0 and not f["viewers_lost"]
    assert f["viewer_messages"]["min"] > 0


def test_peer_trl_markdown_has_a_row_per_side_and_the_ratio_to_trl():
    pt = load("peer_trl.py")
    row = {key: 1.0 for _, key, _ in pt.ROWS} | {"target_s": None, "target_step": None}
    fast = dict(row, samples_per_s=3.5, target_s=2.0, target_step=4)
    lines = pt.markdown_table({"trl": row, "async": fast}, 0.5).splitlines()
    assert len(lines) == 4 and "time to reward 0.5" in lines[0]
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    trl, async_ = ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
    assert trl[:3] == ["trl", "1.0", "1.00×"] and trl[4] == "not reached"
    assert async_[:3] == ["async", "3.5", "3.50×"] and async_[4] == "2 (step 4)"


def test_peer_trl_runs_trl_at_its_defaults_and_labels_a_row_that_is_not():
    pt = load("peer_trl.py")
    default = pt.parse_args([])
    assert default.trl_threads is None and not default.trl_fp32
    assert pt.trl_label(default.trl_threads, default.trl_fp32) == "trl"
    for flags, said in ((["--trl-fp32"], "--trl-fp32"), (["--trl-threads", "1"], "--trl-threads 1")):
        args = pt.parse_args(flags)
        label = pt.trl_label(args.trl_threads, args.trl_fp32)
        assert said in label and "a sensitivity setting, not TRL's default" in label
    row = {key: 1.0 for _, key, _ in pt.ROWS} | {"target_s": None, "target_step": None}
    label = pt.trl_label(None, True)
    lines = pt.markdown_table({"trl": dict(row, label=label), "async": row}, 0.5).splitlines()
    assert lines[2].startswith(f"| {label} | 1.0 | 1.00× |") and lines[3].startswith("| async |")


def test_peer_trl_runner_leaves_trls_precision_default_unless_told_fp32():
    runner = load("peer_trl_runner.py")
    assert runner.precision_args({}) == {}  # GRPOConfig's default: bf16 mixed precision
    assert runner.precision_args({"precision": "fp32"}) == {"bf16": False, "fp16": False}
    with pytest.raises(SystemExit, match="precision must be absent"):
        runner.precision_args({"precision": "fp16"})


def test_peer_trl_figures_keep_the_best_moving_mean():
    pt = load("peer_trl.py")
    r = pt.figures(
        [float(t) for t in range(1, 8)], [0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.2], 8, [1] * 7, [0] * 7, [0] * 7, 0.9
    )
    assert r["reward_best"] == pytest.approx(0.46)


# ---- long_run_read -----------------------------------------------------------------------


def test_long_run_read_refuses_bad_flags_naming_them():
    for args, name in [
        (["--steps", "0"], "--steps"),
        (["--databases", "mysql"], "--databases"),
        (["--databases", "postgresql", "--database-url", "sqlite:///x.db"], "--database-url"),
    ]:
        done = bench("long_run_read.py", *args, timeout=60)
        assert done.returncode == 2 and name in done.stderr, done.stdout + done.stderr


@pytest.mark.slow  # thousands of rows read back: not for the inner loop
@pytest.mark.parametrize("store", ["rebuild", "ingest"])
def test_long_run_read_times_each_read_on_sqlite(tmp_path, store):
    out = tmp_path / "read.json"
    done = bench(
        "long_run_read.py",
        *("--steps", "3000", "--series", "3", "--repeat", "3", "--store", store),
        *("--databases", "sqlite", "--json", str(out)),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "sqlite:" in done.stdout and "the page's request p95" in done.stdout
    f = json.loads(out.read_text())["sqlite"]
    assert f["vendor"] == "sqlite" and f["max_points"] > 0
    # 3 series of 3,000 points each, downsampled to at most max_points each.
    assert 3 < f["points_returned"] <= 3 * min(3000, f["max_points"])
    assert set(f["answer_bytes"]) == {"page", "refresh", "zoom"}
    assert len(f["times"]) == 4 and all(len(t) == 3 and min(t) > 0 for t in f["times"].values())


@pytest.mark.slow  # a database of its own, migrated: not for the inner loop
def test_long_run_read_on_postgresql_in_a_database_of_its_own(tmp_path):
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.skip("needs DATABASE_URL (PostgreSQL): `make test` sets it")
    out = tmp_path / "read.json"
    done = bench(
        "long_run_read.py",
        *("--steps", "3000", "--series", "3", "--repeat", "3", "--databases", "postgresql"),
        *("--database-url", url, "--json", str(out)),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    f = json.loads(out.read_text())["postgresql"]
    assert f["vendor"] == "postgresql" and all(len(t) == 3 for t in f["times"].values())


# ---- scale_out ---------------------------------------------------------------------


def test_scale_out_refuses_bad_flags_naming_them():
    done = bench("scale_out.py", "--configs", "1r-1n,8r-9n", timeout=60)
    assert done.returncode == 2 and "--configs: unknown ['8r-9n']" in done.stderr
    done = bench("scale_out.py", "--steps", "2", timeout=60)
    assert done.returncode == 2 and "--steps must be ≥ 3" in done.stderr


def test_scale_out_figures_leave_step_one_out_and_split_each_ranks_time():
    scale_out = load("scale_out.py")
    series = {
        "trainer/step_s": [(1, 9.0), (2, 0.2), (3, 0.4)],
        "samples/per_s": [(1, 1.0), (2, 100.0), (3, 50.0)],
        "trainer/idle_frac": [(2, 0.1), (3, 0.3)],
        "sync/latency_ms": [(2, 10.0), (3, 30.0)],
        "reward/mean": [(1, 0.1), (3, 0.5)],
        **{f"trainer/rank_comm_s/{r}": [(2, 0.1), (3, 0.1)] for r in (0, 1)},
        **{f"trainer/rank_compute_s/{r}": [(2, 0.3), (3, 0.1 + 0.2 * r)] for r in (0, 1)},
        **{f"trainer/rank_comm_bytes/{r}": [(2, 2**20), (3, 3 * 2**20)] for r in (0, 1)},
        **{f"trainer/rank_busy_frac/{r}": [(2, 0.9), (3, 0.7)] for r in (0, 1)},
    }
    row = scale_out.figures({"series": series}, ranks=2)
    assert row["step_s"] == pytest.approx(0.3) and row["samples_per_s"] == pytest.approx(75)
    assert row["trainer_busy"] == pytest.approx(0.8) and row["sync_ms"] == pytest.approx(20)
    assert row["comm_share"] == pytest.approx([0.1 / 0.3, 0.1 / 0.4])
    assert row["comm_mb"] == pytest.approx([2.0, 2.0]) and row["reward_last"] == 0.5


def test_peer_trl_runner_scores_the_learning_tasks_with_their_own_verifiers():
    import random

    from workers.config.run_config import TaskConfig
    from workers.rl_tasks import make_task

    runner = load("peer_trl_runner.py")
    rng = random.Random(0)
    for section in (
        {"name": "countdown", "options": {"count": 2}},
        {"name": "gsm8k", "options": {"max_number": 9}},
        {"name": "gsm8k", "options": {"max_number": 9, "steps": 2}},
    ):
        task = make_task(TaskConfig(**section))
        score = runner.project_reward(section)
        for prompt, answer in task.sample(50, rng):
            for completion in (task.demonstration(prompt, answer), answer, "3+4", "1+2=3 #### 3", ""):
                assert score(completion, answer) == task.reward(completion, answer)


# ---- learning (pure parts: the runs take minutes) ---------------------------------------


def test_learning_refuses_bad_flags_naming_them():
    for args, flag in (
        (["--seeds", "a,b"], "--seeds"),
        (["--sides", "sync,verl"], "--sides"),
        (["--steps", "0"], "--steps"),
        (["--trl-threads", "0"], "--trl-threads"),
    ):
        done = bench("learning.py", *args)
        assert done.returncode != 0 and flag in done.stderr, done.stderr


def test_learning_runs_trl_on_its_default_threads_and_labels_any_other_count():
    lb = load("learning.py")
    assert lb.parse_args([]).trl_threads is None  # the runner then leaves torch's default alone
    assert lb.parse_args(["--trl-threads", "1"]).trl_threads == 1
    assert lb.side_label("trl", None) == "trl"
    assert lb.side_label("sync", 1) == "sync"
    held = lb.side_label("trl", 1)
    assert "--trl-threads 1" in held and "sensitivity" in held
    assert not lb.parse_args([]).trl_fp32  # the runner then leaves GRPOConfig's bf16 default alone
    assert "--trl-fp32" in lb.side_label("trl", None, True) and lb.side_label("async", None, True) == "async"
    peer = load("peer_trl.py")  # both benches word TRL's label alike
    for threads, fp32 in ((None, False), (1, False), (None, True), (2, True)):
        assert lb.side_label("trl", threads, fp32) == peer.trl_label(threads, fp32)
    run = {"seed": 0, "before": 0.2, "after": 0.3, "samples": 7680, "wall_s": 50.0, "curve": {0: 0.2, 60: 0.3}}
    assert f"| {held} | 0 |" in lb.table({held: [run]})


def test_learning_trains_trl_on_the_prompts_rollways_worker_draws_held_out_excluded():
    import random

    from workers.rl_tasks import make_task
    from workers.rollout.evaluation import is_held_out, problem_key, training_prompts

    lb = load("learning.py")
    cfg = lb.recipe_config(lb.RECIPES["countdown"], ROOT, 3, 5, "sync", {})
    prompts = lb.training_prompts_in_order(cfg, 4)
    # workers/run/actors.py: one rng per worker, one batch of batch_groups per generate call
    task = make_task(cfg.task)
    source, rng = training_prompts(cfg, task, task), random.Random("3-prompts-0")
    expected = [pair for _ in range(4) for pair in source.sample(cfg.trainer.batch_groups, rng)]
    assert [(p["prompt"], p["answer"]) for p in prompts] == expected
    assert not any(is_held_out(problem_key(task, *pair)) for pair in expected)


def test_learning_table_gives_mean_spread_and_each_seed():
    lb = load("learning.py")
    runs = [
        {"seed": 0, "before": 0.2, "after": 0.4, "samples": 7680, "wall_s": 100.0, "curve": {0: 0.2, 60: 0.4}},
        {"seed": 1, "before": 0.2, "after": 0.3, "samples": 7680, "wall_s": 110.0, "curve": {0: 0.2, 60: 0.3}},
    ]
    text = lb.table({"sync": runs})
    assert "| sync | 0, 1 | 0.200 ± 0.000 → 0.350 ± 0.071 | 0.200→0.400, 0.200→0.300 | +0.150, +0.100 | 7680 |" in text
    assert "60: 0.350" in lb.curves({"sync": runs})


# ---- simulate_presets --------------------------------------------------------------


def test_simulate_presets_prints_a_row_each_and_the_calibration(tmp_path):
    out, table = tmp_path / "sim.json", tmp_path / "sim.md"
    args = ["--presets", "sync,sync@colocated,async", "--models", "7B,32B", "--lengths", "2048", "--gpus", "8"]
    done = bench("simulate_presets.py", *args, "--json", str(out), "--markdown", str(table))
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert [r["preset"] for r in figures["rows"]] == ["sync", "sync@colocated", "async"] * 2
    assert all(r["samples_per_s"] > 0 for r in figures["rows"])
    # The colocated baseline as the engine lays it out: a worker of one GPU per GPU, 32B too.
    colocated = [r for r in figures["rows"] if r["preset"] == "sync@colocated"]
    assert [r["workers"] for r in colocated] == [8, 8]
    # Every ratio is over the sync preset, whose own row gives its samples/s.
    lines = table.read_text().splitlines()
    assert any(line.startswith("| sync | ") and "/s (0.5)" in line for line in lines)
    assert all(w["speedup_vs_sync"] > 0 for w in figures["winners"])
    assert len(figures["calibration"]) == 6
    assert "published" in done.stdout and "KV floor" in done.stdout


@pytest.mark.slow  # every published scenario simulated in a subprocess: 15-20 s of CPU
def test_simulate_presets_prints_the_published_table(tmp_path):
    out = tmp_path / "published.json"
    done = bench("simulate_presets.py", "--published", "--json", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert {r["fitted"] for r in figures["rows"]} == {True, False}
    assert "| published figure |" in done.stdout and "predicted figures within 20%" in done.stdout


def test_simulate_presets_refuses_bad_flags_naming_them():
    done = bench("simulate_presets.py", "--presets", "async,ring")
    assert done.returncode != 0 and "--presets" in done.stderr and "ring" in done.stderr
    done = bench("simulate_presets.py", "--splits", "1.5")
    assert done.returncode != 0 and "--splits" in done.stderr


# ---- simulate_calibration ----------------------------------------------------------


@pytest.mark.slow
def test_simulate_calibration_prints_measured_and_predicted_per_preset(tmp_path):
    out = tmp_path / "cal.json"
    # One preset: tests/engine/test_simulate_calibration.py replays recorded runs of six.
    series = tmp_path / "series"
    args = [
        "--presets",
        "async",
        "--steps",
        "4",
        *TINY,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--series",
        str(series),
    ]
    done = bench("simulate_calibration.py", *args, "--markdown", "--json", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert set(figures) == {"async"}
    recorded = json.loads((series / "async.json").read_text())
    assert recorded["config"]["mode"] == "async" and len(recorded["series"]["samples/per_s"]) == 4
    for preset in figures.values():
        assert set(preset["measured"]) == set(preset["predicted"]) == {
            "samples/per_s", "trainer/idle_frac", "inference/idle_frac", "staleness/mean"
        }  # fmt: skip
        assert preset["measured"]["samples/per_s"] > 0 and preset["predicted"]["samples/per_s"] > 0
    assert "| async | samples/per_s |" in done.stdout and "costs fed to the simulator" in done.stdout


@pytest.mark.slow  # a subprocess importing Ray and torch: not for the inner loop
def test_delta_sync_prints_a_row_per_learning_rate_with_fewer_bytes_for_the_delta():
    done = bench("delta_sync.py", "--size", "tiny", "--steps", "1", "--lrs", "1e-6,1e-5")
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| 1e-0")]
    assert [r[0] for r in rows] == ["| 1e-06", "| 1e-05"]
    # bytes pulled: full (float32, whole) against the delta: 4 bytes an element against 6
    # a changed one, about 4% of them changed at lr 1e-6 and 25% at 1e-5 in the first step
    for r, share in zip(rows, (0.1, 0.5), strict=True):
        full, delta = float(r[2].split()[0].replace(",", "")), float(r[3].split("–")[0])
        assert delta < share * full


# ---- run_cost ------------------------------------------------------------------------


def test_run_cost_counts_a_process_under_the_role_it_ended_in():
    rc = load("run_cost.py")
    assert rc.role("ray::TrainerActor.train_step") == "trainer"
    assert rc.role("ray::RunDriver.run") == "driver"
    assert rc.role("ray::run-101-trainer:TrainerActor.__init__") == "trainer"  # a named actor's title
    assert rc.role("ray::IDLE") == rc.role("python .../ray/_private/workers/default_worker.py --x") != "trainer"
    assert rc.role("/venv/.../ray/core/src/ray/raylet/raylet --raylet_socket_name=x") == "Ray's own processes"
    assert rc.role("postgres: 15/main: checkpointer") is None  # not the cluster's
    roles = {"trainer": {"processes": 2, "cpu_s": 18.0}, "buffer": {"processes": 2, "cpu_s": 2.0}}
    lines = rc.table(roles, 2, {"torch": 2.5})
    assert lines[2].split() == ["trainer", "1.0", "9.00", "90%"] and lines[4].split() == ["all", "10.00"]
    assert lines[-1].split() == ["torch", "2.50"]
    assert 0 < rc.import_cpu("pass", 1) < 5  # a bare interpreter, its own CPU counted
    sampler = rc.Sampler(parent={11: 10, 12: 11, 21: 20})  # 10 → 11 → 12; 20 → 21 (another tree)
    assert sampler.descends(12, 10) and sampler.descends(10, 10) and not sampler.descends(21, 10)


def test_run_cost_refuses_bad_flags_naming_them():
    done = bench("run_cost.py", "--runs", "0")
    assert done.returncode == 2 and "--runs" in done.stderr
    done = bench("run_cost.py", "--steps", "0")
    assert done.returncode == 2 and "--steps must be ≥ 1" in done.stderr


@pytest.mark.slow  # it starts Ray and runs the engine: not for the inner loop
def test_run_cost_prints_each_actor_kind_per_run(tmp_path, cache_dir):
    out = tmp_path / "cost.json"
    # The suite's cache: its run is the engine tests' tiny run, whose warm start they share.
    args = ("--runs", "1", "--steps", "3", "--no-imports", "--no-warm-up", "--cache-dir", cache_dir, "--json", str(out))
    done = bench("run_cost.py", *args, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    roles = figures["roles"]
    assert figures["steps"] == 3
    for name in ("driver", "trainer", "inference worker", "buffer"):
        assert roles[name]["processes"] == 1 and roles[name]["cpu_s"] > 0, roles
        assert name in done.stdout
    assert "CPU seconds per run, over 1 run of 3 steps" in done.stdout


# ---- suite_cpu -----------------------------------------------------------------------


def test_suite_cpu_names_each_kind_of_process_and_the_services():
    sc = load("suite_cpu.py")
    assert sc.kind("ray::run-7-inference-0:InferenceWorker.generate") == "inference worker"
    assert sc.kind("python -c import sys;exec(eval(sys.stdin.readline())) xdist") == sc.KINDS[0][1]
    assert sc.kind("postgres: 15/main: root test 127.0.0.1(5) idle") == "PostgreSQL"
    assert sc.kind(".venv/bin/python -m pytest -n 3 --dist loadgroup --durations=40") == "pytest"
    # A process a test starts is its own kind, though its arguments name pytest's temporary root.
    bench = ".venv/bin/python bench/simulate_presets.py --json /tmp/pytest-of-root/pytest-0/x/sim.json"
    assert sc.kind(bench) == "bench scripts"
    assert sc.kind(".venv/bin/daphne -b 127.0.0.1 -p 8020 --root /tmp/pytest-of-root/p rollway.asgi:app") == (
        "web (daphne)"
    )
    assert sc.is_service("/usr/bin/redis-server 127.0.0.1:6379") and not sc.is_service("python x.py")
    lines = sc.table({"trainer": {"processes": 2, "cpu_s": 30.0}, "other": {"processes": 1, "cpu_s": 10.0}}, 20, 2)
    assert lines[0] == "wall 20 s, CPU 40 s: the 2 cores 100% busy with it"
    assert lines[2].split()[-3:] == ["2", "30.0", "75%"]


def test_suite_cpu_counts_a_grandchild_whose_parent_exited(tmp_path):
    # The child starts a busy grandchild and exits, as `ray start` leaves its raylet to
    # init: the grandchild's CPU is still the command's.
    busy = "import time; end = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    spawn = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {busy!r}]); time.sleep(0.5)"
    child = f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {spawn!r}]); time.sleep(3)"
    out = tmp_path / "cpu.json"
    done = bench("suite_cpu.py", "--interval", "0.1", "--json", str(out), "--", sys.executable, "-c", child)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = json.loads(out.read_text())["kinds"]
    assert 0.8 < kinds["other"]["cpu_s"] < 3.0 and kinds["other"]["processes"] >= 2, kinds
    assert "cores" in done.stdout and "other" in done.stdout
    seconds, cmdline = json.loads(out.read_text())["top"][0]  # the busy grandchild
    assert seconds > 0.8 and "process_time() < end" in cmdline
    assert "processes that spent the most CPU" in done.stdout


def test_suite_cpu_charges_each_test_the_cpu_of_the_processes_it_started(tmp_path):
    # The command writes two spans as tests/conftest.py does: an idle test, then one whose
    # child spins for a second. The child's CPU is the second test's, none the first's.
    busy = "import time; end = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    child = f"""import json, os, subprocess, sys, time
def span(test, start):
    with open(os.environ["ROLLWAY_TEST_SPANS"], "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), "test": test, "start": start, "end": time.time()}}) + "\\n")
start = time.time(); time.sleep(0.5); span("t.py::idle", start)
start = time.time(); subprocess.run([sys.executable, "-c", {busy!r}]); time.sleep(0.3); span("t.py::busy", start)
"""
    out, spans = tmp_path / "cpu.json", tmp_path / "spans.jsonl"
    spans.write_text("a line of an earlier suite\n")
    args = ("--interval", "0.1", "--json", str(out), "--spans", str(spans))
    done = bench("suite_cpu.py", *args, "--", sys.executable, "-c", child)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert 0.8 < figures["tests"]["t.py::busy"] < 3.0, figures["tests"]
    assert figures["tests"].get("t.py::idle", 0.0) < 0.3, figures["tests"]
    assert set(figures["idle"]) <= {"t.py::idle", "t.py::busy", "(between tests)"}
    assert figures["files"]["t.py"] >= figures["tests"]["t.py::busy"]
    # The spinning child is not the test process's own: its own CPU stays small.
    assert figures["in_process"].get("t.py::busy", 0.0) < 0.5, figures["in_process"]
    assert "tests whose own process spent the most CPU" in done.stdout
    assert "tests that spent the most CPU" in done.stdout and "t.py::busy" in done.stdout
    # One process ran both tests: from about 0 s in to its last span's end, most of it in them.
    kept = [json.loads(line) for line in spans.read_text().splitlines()]  # this run's lines only
    assert [k["test"] for k in kept] == ["t.py::idle", "t.py::busy"]
    (worker,) = figures["workers"]
    assert worker["pid"] == kept[0]["pid"] and worker["tests"] == 2
    assert 0 <= worker["first_s"] < worker["last_s"] and 1.5 < worker["in_tests_s"] <= worker["last_s"]
    assert "each process that ran tests" in done.stdout


def test_suite_cpu_charges_a_read_to_the_test_then_running_or_between_tests():
    sc = load("suite_cpu.py")
    tree = sc.Tree(root=1)
    tree.members = {(7, 0), (8, 0), (9, 0)}
    tree.ancestors = {(7, 0): (5,), (8, 0): (6, 5), (9, 0): (4,)}  # 5 ran the tests
    tree.spent = [(5.0, (7, 0), 1.0), (15.0, (8, 0), 2.0), (25.0, (7, 0), 3.0), (25.0, (9, 0), 4.0)]
    spans = {5: [sc.Span(5, "t.py::a", 0.0, 10.0), sc.Span(5, "t.py::b", 20.0, 30.0)]}
    assert sc.by_test(tree, spans) == {"t.py::a": 1.0, sc.BETWEEN: 2.0, "t.py::b": 3.0, sc.UNDER_NO_TEST: 4.0}
    # Its own process's CPU only: 5's reads, none of its children's, none of another tree's.
    tree.members |= {(5, 0)}
    tree.spent += [(6.0, (5, 0), 0.5), (22.0, (5, 0), 0.25), (35.0, (5, 0), 0.125)]
    assert sc.by_test(tree, spans, own=True) == {"t.py::a": 0.5, "t.py::b": 0.25, sc.BETWEEN: 0.125}


def test_suite_cpu_shares_each_reads_idle_among_the_tests_then_running():
    sc = load("suite_cpu.py")
    spans = {
        5: [sc.Span(5, "t.py::waits", 0.0, 10.0), sc.Span(5, "t.py::late", 20.0, 30.0)],
        6: [sc.Span(6, "t.py::spins", 0.0, 12.0)],
    }
    idle = [(5.0, 1.0), (11.0, 0.8), (15.0, 0.5), (25.0, 0.2)]
    assert sc.idle_by_test(idle, spans) == pytest.approx(
        {"t.py::waits": 0.5, "t.py::spins": 1.3, sc.BETWEEN: 0.5, "t.py::late": 0.2}
    )
    first = sc.host_idle_s()  # the host's idle core-seconds since boot: they only grow
    time.sleep(0.1)
    assert first is not None and first > 0 and sc.host_idle_s() >= first


def test_suite_cpu_refuses_a_negative_top_naming_it():
    done = bench("suite_cpu.py", "--top", "-1", "--", "true")
    assert done.returncode == 2 and "--top" in done.stderr


def test_suite_cpu_refuses_a_bad_interval_naming_it():
    done = bench("suite_cpu.py", "--interval", "0", "--", "true")
    assert done.returncode == 2 and "--interval" in done.stderr


# ---- suite_time ----------------------------------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" tests="4" time="50.5">
<testcase classname="tests.engine.test_driver" name="test_a_run[x]@tests/engine/test_driver.py" time="30.0" />
<testcase classname="tests.engine.test_driver" name="test_b" time="10.0" />
<testcase classname="tests.platform.test_matrix.TestTwoTeams" name="test_cell[GET a]" time="6.0" />
<testcase classname="tests.test_layout" name="test_c" time="4.0" />
</testsuite></testsuites>
"""


def test_suite_time_sums_each_part_and_file_and_names_the_slowest(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    done = bench("suite_time.py", str(junit), "--tests", "1")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert "pytest wall time 50 s (0.8 min); test time 50 s over 4 tests" in done.stdout
    assert ["40", "s", "80%", "tests/engine"] in lines and ["6", "s", "12%", "tests/platform"] in lines
    assert ["4", "s", "8%", "top-level"] in lines
    assert ["40", "80%", "2", "tests/engine/test_driver.py"] in lines  # a test class is its file's
    assert ["6", "12%", "1", "tests/platform/test_matrix.py"] in lines
    assert lines[-1] == ["30.0", "s", "tests/engine/test_driver.py::test_a_run[x]"]  # xdist's @group dropped


def test_suite_time_compares_each_file_with_an_earlier_run(tmp_path):
    before, after = tmp_path / "before.xml", tmp_path / "after.xml"
    before.write_text(JUNIT)
    after.write_text(JUNIT.replace('time="30.0"', 'time="12.0"'))
    done = bench("suite_time.py", str(after), "--compare", str(before), "--tests", "0")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["22", "40", "-18", "2", "tests/engine/test_driver.py"] in lines
    assert ["4", "4", "+0", "1", "tests/test_layout.py"] in lines
    assert ["32", "50", "-18", "4", "all"] in lines
    assert "slowest" not in done.stdout  # --tests 0 leaves the list out


def test_suite_time_refuses_a_missing_file_and_bad_flags_naming_them(tmp_path):
    done = bench("suite_time.py", str(tmp_path / "nope.xml"))
    assert done.returncode == 2 and "junit: cannot read" in done.stderr and "nope.xml" in done.stderr
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    done = bench("suite_time.py", str(junit), "--compare", str(tmp_path / "gone.xml"))
    assert done.returncode == 2 and "--compare: cannot read" in done.stderr
    done = bench("suite_time.py", str(junit), "--files", "-1")
    assert done.returncode == 2 and "--files must be 0 or more" in done.stderr


# ---- trainer_step ------------------------------------------------------------------


@pytest.mark.slow  # a subprocess importing torch that trains two tiny trainers: not for the inner loop
def test_trainer_step_prints_each_sides_phases():
    done = bench("trainer_step.py", "--steps", "1", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert {"model forward", "model backward", "clip + AdamW", "step"} <= rows.keys()
    assert "shared prompts: the model runs" in done.stdout
    assert "less CPU time with shared prompts" in done.stdout


# ---- league ----------------------------------------------------------------------------


def test_league_markdown_has_a_row_per_preset_marks_the_best_and_lists_approximations():
    lg = load("league.py")
    columns = [
        {"key": "samples_per_s", "label": "samples/s", "group": "measured here"},
        {"key": "7B@64:trainer_idle", "label": "trainer idle", "group": "simulated: 7B on 64 GPUs"},
    ]

    def cell(value, text):  # as the site's league gives it
        return {"value": value, "text": text}

    def row(name, samples, idle, approximates=""):
        cells = {"samples_per_s": cell(*samples), "7B@64:trainer_idle": cell(*idle)}
        return {"configuration": name, "cells": cells, "approximates": approximates}

    league = {
        "columns": columns,
        "rows": [
            row("async", (12.5, "12.5"), (0.25, "25%")),
            row("slime", (None, "—"), (0.5, "50%"), "Cannot reproduce: OPSM"),
        ],
        "best": {"samples_per_s": [], "7B@64:trainer_idle": ["async"]},
    }
    lines = lg.league_markdown(league).splitlines()
    assert lines[0] == "| preset | samples/s (measured here) | trainer idle (7B on 64 GPUs) |"
    assert lines[2] == "| async | 12.5 | 25% ★ |" and lines[3] == "| slime | — | 50% |"
    assert lines[-1] == "- **slime**: Cannot reproduce: OPSM"
