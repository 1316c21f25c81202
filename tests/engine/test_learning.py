"""Learning works: GRPO raises held-out pass@1 beyond a control that cannot learn.

bench/learning.py's countdown recipe (its `RECIPES["countdown"]`: a tiny Qwen2 with one
token per character, warm-started by 120 clean supervised steps to partial competence on
held-out problems, then GRPO at lr 3e-4, B=16 x G=8, 60 steps, torch backend), run through
the real driver and actors in the `sync` and `async` presets, both beside one control: a
sync run at a learning rate of 1e-9 (2 steps), whose held-out pass@1 stays the checkpoint's. The
seed is fixed; held-out pass@1 is the end-of-run eval pass (64 held-out problems x k=8).

Left alone, what an async run trains depends on the host's speed (which version each
generate call starts on): inside a loaded suite async seed 0 once ended at 0.295 where it
had given 0.369 alone. So the async run follows a schedule, through the replay hook a
recorded run's replay uses (workers/run/schedule.py): one-step-off, every call after the
first starting on the weights one step behind the batch it feeds.
docs/learning.md has the recipe's figures over five seeds and the command behind them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import ray

from tests.engine.helpers import on_rays_threads
from workers.core.records import call_seed, group_id
from workers.core.run_actors import NAMESPACE
from workers.rollout.evaluation import PASS_AT_1
from workers.run.driver import RunDriver
from workers.run.paths import Confinement
from workers.run.schedule import Schedule

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

SEED = 1
# Trained minus control, held-out pass@1, that each preset must beat. The runs' actors keep
# Intel MKL in its reproducible mode (workers/core/worker_process.py) and one torch thread
# each (below), the warm start is built the same way, and the async run follows
# `one_step_off`, so each figure repeats. Seeds 0, 1 and 2 give sync 0.389, 0.354, 0.357
# and async 0.277, 0.377, 0.377 against the control's 0.256, 0.289, 0.234: sync +0.133,
# +0.064, +0.123 and async +0.021, +0.088, +0.143. Async one step off can gain much less
# per sample on this recipe (seed 0), so the seed fixed is one where both learn; the
# margin is under half the smaller gain there.
MARGIN = 0.02
CONTROL_LR = 1e-9
# The control's steps: at CONTROL_LR its weights move by nothing measurable in 2 steps or
# in 60, so its end-of-run pass measures the checkpoint either way; 2 cost a thirtieth.
CONTROL_STEPS = 2


def _learning_bench():
    """bench/learning.py as a module: the recipe and its warm start live there, once."""
    spec = importlib.util.spec_from_file_location("learning", BENCH / "learning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEARNING = _learning_bench()
RECIPE = {
    **LEARNING.RECIPES["countdown"],
    # One eval pass, the end-of-run one: the figure compared.
    "eval": {**LEARNING.RECIPES["countdown"]["eval"], "every_steps": LEARNING.RECIPES["countdown"]["steps"]},
}


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("learning")


@pytest.fixture(scope="module")
def policy(cluster, work_dir) -> str:
    """The recipe's warm-started checkpoint, built once for the module, in a Ray worker as
    a run's driver builds one: with Intel MKL in its reproducible mode and one thread
    (workers/core/worker_process.py), whatever pytest's own process has set. Built in a
    script that had set one torch thread itself, the same recipe gave runs with other
    figures (sync seed 2: held-out 0.381, against 0.322 from the policy built here)."""
    build = ray.remote(num_cpus=1)(on_rays_threads)
    return ray.get(build.remote(LEARNING.make_policy, RECIPE, str(work_dir)), timeout=1200)


def one_step_off(steps: int, groups: int, seed: int) -> dict:
    """The schedule of a one-step-off async run with one inference worker: its first two
    calls start on version 0, call c after them on version c - 1, each of `groups` groups,
    and batch k (trained at version k) is call k's groups, named by the call's seed."""
    calls = [call_seed(seed, 0, c) for c in range(steps)]
    schedule = {
        "admissions": [[0, max(c - 1, 0), groups] for c in range(steps)],
        "batches": [[k, [group_id(calls[k], i) for i in range(groups)]] for k in range(steps)],
    }
    Schedule.from_json(schedule)  # well formed, as the driver checks it
    return schedule


def held_out_after(mode: str, lr: float, steps: int, policy: str, work_dir: Path, seed: int, run_id: int) -> float:
    """Held-out pass@1 at the end of a run of `steps` steps of the recipe in preset `mode`
    at `lr`; an async run follows `one_step_off`."""
    # One thread per actor: a run at two (sync's default here) rounded differently from
    # one launch to another even with MKL's reproducible mode (held-out 0.354 alone, 0.283
    # once inside the whole suite), where one thread has repeated its figures every time.
    extra = {"trainer": {"lr": lr}, "placement": {"cpu_threads": 1}}
    cfg = LEARNING.recipe_config(RECIPE, policy, seed, steps, mode, extra)
    confinement = Confinement.from_lists(
        [str(work_dir), os.path.dirname(policy)], [], scratch_root=str(work_dir / "scratch")
    )
    replay = one_step_off(steps, cfg.trainer.batch_groups, seed) if mode == "async" else None
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE).remote(
        run_id, cfg.model_dump(mode="json"), None, "", str(work_dir / "cache"), exit_when_done=False,
        confinement=confinement, replay=replay,
    )  # fmt: skip
    try:
        out = ray.get(driver.run.remote(), timeout=1200)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error"]
    if replay is not None:  # it followed the schedule: its first batch fresh, every later one a step old
        staleness = [float(v) for _, v in sorted(out["series"]["staleness/mean"])]
        assert staleness == [0.0] + [1.0] * (steps - 1), staleness
    evals = {int(step): float(v) for step, v in out["series"][PASS_AT_1]}
    assert max(evals) == steps, evals  # the pass on the last step's weights
    return evals[max(evals)]


def measure(policy: str, work_dir: Path, seed: int) -> dict[str, float]:
    """Held-out pass@1 after each of the three runs of `seed`: sync and async trained, and
    one control. The control's weights move by nothing measurable, so its figure is the
    checkpoint's in either mode (both modes' controls gave the same figure on seeds 0, 1
    and 3, CHANGELOG.md); one run of it, CONTROL_STEPS long, stands for both."""
    lr, steps = RECIPE["trainer"]["lr"], RECIPE["steps"]
    runs = [("sync trained", "sync", lr, steps), ("async trained", "async", lr, steps)]
    runs.append(("control", "sync", CONTROL_LR, CONTROL_STEPS))
    return {
        name: held_out_after(mode, lr, steps, policy, work_dir, seed, run_id=970_000 + 10 * seed + i)
        for i, (name, mode, lr, steps) in enumerate(runs)
    }


def test_grpo_raises_held_out_pass_at_1_beyond_a_control_in_sync_and_async(cluster, policy, work_dir):
    figures = measure(policy, work_dir, SEED)
    print(f"\nheld-out pass@1, seed {SEED}: {figures}")
    for mode in ("sync", "async"):
        trained, control = figures[f"{mode} trained"], figures["control"]
        assert trained > control + MARGIN, f"{mode}: trained {trained:.3f}, control {control:.3f} (seed {SEED})"
