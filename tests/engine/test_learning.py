"""Learning works: GRPO raises held-out pass@1 beyond a control that cannot learn.

bench/learning.py's countdown recipe (its `RECIPES["countdown"]`: a tiny Qwen2 with one
token per character, warm-started by 120 clean supervised steps to partial competence on
held-out problems, then GRPO at lr 3e-4, B=16 x G=8, 60 steps, torch backend), run through
the real driver and actors in the `sync` and `async` presets, both beside one control: a
sync run at a learning rate of 1e-9 (2 steps), whose held-out pass@1 stays the checkpoint's. The
seed is fixed; held-out pass@1 is the end-of-run eval pass (64 held-out problems x k=8).
docs/learning.md has the recipe's figures over five seeds and the command behind them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import ray

from workers.core.run_actors import NAMESPACE
from workers.rollout.evaluation import PASS_AT_1
from workers.run.driver import RunDriver
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

SEED = 0
# Trained minus control, held-out pass@1, that each preset must beat. The runs' actors keep
# Intel MKL in its reproducible mode (workers/core/worker_process.py) and one torch thread
# each (below): seed 0 gives sync 0.361 and async 0.369 against the control's 0.275
# (+0.086, +0.094). Over five seeds the bench's smallest sync gain is +0.072
# (docs/learning.md). The margin is under half the smallest.
MARGIN = 0.03
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
def policy(work_dir, one_torch_thread_module) -> str:
    """The recipe's warm-started checkpoint, built once for the module."""
    return LEARNING.make_policy(RECIPE, str(work_dir))


@pytest.fixture(scope="module")
def one_torch_thread_module():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # beside the Ray actors on a 2-core host, one thread each
    yield
    torch.set_num_threads(before)


def held_out_after(mode: str, lr: float, steps: int, policy: str, work_dir: Path, seed: int, run_id: int) -> float:
    """Held-out pass@1 at the end of a run of `steps` steps of the recipe in preset `mode` at `lr`."""
    # One thread per actor: a run at two (sync's default here) rounded differently from
    # one launch to another even with MKL's reproducible mode (held-out 0.354 alone, 0.283
    # once inside the whole suite), where one thread has repeated its figures every time.
    extra = {"trainer": {"lr": lr}, "placement": {"cpu_threads": 1}}
    cfg = LEARNING.recipe_config(RECIPE, policy, seed, steps, mode, extra)
    confinement = Confinement.from_lists(
        [str(work_dir), os.path.dirname(policy)], [], scratch_root=str(work_dir / "scratch")
    )
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE).remote(
        run_id, cfg.model_dump(mode="json"), None, "", str(work_dir / "cache"), exit_when_done=False,
        confinement=confinement,
    )  # fmt: skip
    try:
        out = ray.get(driver.run.remote(), timeout=1200)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error"]
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
