"""The setup every Ray worker process of a run runs first (workers/core/worker_process.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers.core import worker_process
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


def test_the_runs_ray_job_names_the_setup_hook(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(lifecycle.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(lifecycle.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MKL_CBWR", raising=False)
    lifecycle.connect()
    assert calls[0]["runtime_env"] == {
        "worker_process_setup_hook": "workers.core.worker_process.setup",
        "env_vars": {"MKL_CBWR": "AUTO,STRICT"},
    }
    assert worker_process.runtime_env() is not worker_process.runtime_env()  # ray.init writes into it


def test_an_mkl_mode_the_environment_sets_reaches_the_workers_instead(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert worker_process.runtime_env()["env_vars"] == {"MKL_CBWR": "COMPATIBLE"}
