"""What every Ray worker process of a run sets before any actor code runs: Ray's
`worker_process_setup_hook`, named by module path in the job's runtime environment
(`runtime_env()`, given to `ray.init`, which also sets Intel MKL's reproducible mode), so
Ray imports this module in each worker as it starts. The standard library only: whatever
this imports, every worker pays for.

It hides two packages from transformers: scikit-learn and SciPy. While it loads any
causal LM, transformers imports `sklearn.metrics` (for assisted generation's candidate
generator) and `scipy` (for object detection's losses) whenever they are installed, and
the `mlflow` extra installs both. No actor of a run uses either, and together they cost
about 1.9 s of CPU in every process that loads a model (the trainer, each rank, each
inference worker), measured on a 2-core host. transformers asks `importlib.util.find_spec`
whether a package is there, which answers None for a name whose `sys.modules` entry is
None, and an `import` of it raises ImportError, as for a package not installed.
"""

from __future__ import annotations

import os
import sys

HIDDEN = ("sklearn", "scipy")


def setup() -> None:
    """Ray's worker_process_setup_hook: hide `HIDDEN` (unless already imported)."""
    for name in HIDDEN:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


# Intel MKL (torch's BLAS on x86 CPUs) picks its code path per call from the data's memory
# alignment and the threads free at that moment unless its Conditional Numerical
# Reproducibility mode is on, so the same run on the same host could round a matmul
# differently from one launch to the next: a 60-step GRPO run at two torch threads per actor
# ended at held-out pass@1 0.332 once and 0.342 twice. AUTO,STRICT keeps MKL's fastest code
# path for the CPU and makes each MKL result depend on the inputs and the thread count only
# (no slower on 2-thread matmuls of this project's shapes, measured). It is not the whole
# story at two threads: a sync run there still varied once (docs/reliability.md); at one
# thread per actor runs repeated every time. An MKL_CBWR the environment already sets wins.
MKL_REPRODUCIBLE = "AUTO,STRICT"


def runtime_env() -> dict:
    """The job's runtime environment naming `setup`, with MKL's reproducible mode (unless
    the environment names another): a new dict each call, since `ray.init` writes into the
    one it is given."""
    return {
        "worker_process_setup_hook": f"{__name__}.setup",
        "env_vars": {"MKL_CBWR": os.environ.get("MKL_CBWR", MKL_REPRODUCIBLE)},
    }


def init_local_ray(namespace: str, num_cpus: int = 2) -> None:
    """A Ray cluster of this process's own (address "local": even where RAY_ADDRESS or a
    `ray start` on this host names another one) whose workers are set up as a run's: what
    the bench scripts measure on."""
    import ray  # here, not above: every worker imports this module before anything else

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        namespace=namespace,
        log_to_driver=False,
        runtime_env=runtime_env(),
    )
