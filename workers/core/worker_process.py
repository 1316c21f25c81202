"""What every Ray worker process of a run sets before any actor code runs (`setup_ray_worker`):
the engine's package runs it when a Ray worker imports it (workers/__init__.py), which Ray
does to load an actor's class, before the actor's module imports torch or transformers.
It sets Intel MKL's reproducible mode (MKL_REPRODUCIBLE) and then `setup`. The standard
library only: whatever this imports, every worker pays for.

Why not Ray's own `worker_process_setup_hook`: it is a field of a runtime environment, and
for a job with any runtime environment the raylet starts each worker through Ray's
setup_worker.py, a Python process that imports Ray only to exec the real worker: an
actor's process spent 1.41-1.84 s of CPU to its first call that way and 0.79-0.91 s
without (a local cluster on a loaded 2-core host), for every actor a run starts (a driver,
a buffer, a trainer and an inference worker at least).

It holds the garbage collector's full collections until the actor has started (`setup`,
then `started`, which workers.core.run_actors.actor_class calls when the actor's
constructor returns): see STARTUP_OLDEST_THRESHOLD.

It hides two packages from transformers: scikit-learn and SciPy. While it loads any
causal LM, transformers imports `sklearn.metrics` (for assisted generation's candidate
generator) and `scipy` (for object detection's losses) whenever they are installed, and
the `mlflow` extra installs both. No actor of a run uses either, and together they cost
about 1.9 s of CPU in every process that loads a model (the trainer, each rank, each
inference worker), measured on a 2-core host. transformers asks `importlib.util.find_spec`
whether a package is there, which answers None for a name whose `sys.modules` entry is
None, and an `import` of it raises ImportError, as for a package not installed.

And it has the two answers transformers works out at every import (the installed
distributions, its lazy modules' tables) read from the host's cache (`import_memo`).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from workers.core import import_memo

HIDDEN = ("sklearn", "scipy")

# CPython collects its oldest generation after every 10 × 10 × 700 container allocations
# (its default thresholds), and each such collection walks every object alive. Importing
# torch, transformers and a model class makes hundreds of thousands of them, so a process
# loading a model spent about a quarter of its import CPU in those collections: 4.1 s of
# CPU with them, 3.1 s without, on a 2-core host. Until the actor has started they wait
# (young collections still run, so short-lived cycles are still freed); then `started`
# freezes what start-up built out of every later collection, as Ray Serve's replicas and
# vLLM's engine do after theirs, and puts the thresholds back.
STARTUP_OLDEST_THRESHOLD = 1_000_000
_held: tuple[int, int, int] | None = None  # the thresholds `hold_full_collections` replaced


def in_ray_worker() -> bool:
    """Whether this process is a worker a raylet started: the raylet names itself in its
    workers' environment (RAY_RAYLET_PID), never in a driver's."""
    return "RAY_RAYLET_PID" in os.environ


def setup_ray_worker() -> None:
    """MKL's reproducible mode (unless the raylet's environment names another), then `setup`."""
    os.environ.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)
    setup()


def setup() -> None:
    """Hide `HIDDEN` (unless already imported), and hold
    full collections until the actor has started. A worker that runs tasks instead of an
    actor (none of a run's) keeps them held: its young collections still run."""
    for name in HIDDEN:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    import_memo.install()
    hold_full_collections()


def hold_full_collections() -> None:
    """Collect the oldest generation almost never until `started` (once per process)."""
    global _held
    if _held is None:
        _held = gc.get_threshold()
        gc.set_threshold(_held[0], _held[1], STARTUP_OLDEST_THRESHOLD)


def take_rays_threads() -> None:
    """torch computes on the threads Ray gives this actor: OMP_NUM_THREADS, which Ray sets
    from the CPUs the actor reserved (at least 1) before its constructor runs. Imports
    nothing: where torch is not imported yet, it takes the count when it loads (from
    MKL_NUM_THREADS, set here unless the environment sets it, or from OMP_NUM_THREADS).

    OpenMP reads OMP_NUM_THREADS once, when it is loaded. Where the host preloads it
    (LD_PRELOAD naming torch's libgomp, as vLLM-CPU asks and sets for its own engine, and
    every process started after it inherits), it loads when the worker process starts,
    before Ray sets the variable, and torch took every core, whether it was imported
    before the constructor (a run's driver, reserving no CPU, trained its warm start on
    two threads beside the run's other actors, spending 10.9-15.6 s of CPU where its own
    thread spent 6.4-8.6 s, on a 2-core host running the test suite) or after it (a
    reward worker loading its process-reward model). Actors that choose their own count
    (the trainer, inference workers) set it after this."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if not (threads.isdigit() and int(threads) > 0):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(threads))
    else:
        os.environ.setdefault("MKL_NUM_THREADS", threads)


def started() -> None:
    """Start-up is over (an actor's constructor returned, or pytest collected its tests):
    what start-up built frozen (never scanned again: the modules, the model's objects),
    and the thresholds `setup` found restored. Does nothing where collections were not
    held.

    No full collection first: young collections ran all along, so little start-up garbage
    reaches the oldest generation. After a trainer's imports and a tiny model (about
    400,000 objects tracked) one found 190 unreachable objects and cost 0.18 s of CPU, in
    every actor that loads a model; frozen, they wait for the process's exit."""
    global _held
    if _held is None:
        return
    gc.freeze()
    # Thawed at exit, so that the interpreter's last collection frees what start-up built
    # as it would have: nanobind (triton's bindings) reports whatever is left as leaked.
    atexit.register(gc.unfreeze)
    gc.set_threshold(*_held)
    _held = None


# Intel MKL (torch's BLAS on x86 CPUs) picks its code path per call from the data's memory
# alignment and the threads free at that moment unless its Conditional Numerical
# Reproducibility mode is on, so the same run on the same host could round a matmul
# differently from one launch to the next: a 60-step GRPO run at two torch threads per actor
# ended at held-out pass@1 0.332 once and 0.342 twice. AUTO,STRICT keeps MKL's fastest code
# path for the CPU and makes each MKL result depend on the inputs and the thread count only
# (no slower on 2-thread matmuls of this project's shapes, measured). It is not the whole
# story at two threads: a sync run there still varied once (docs/reliability.md); at one
# thread per actor runs repeated every time. An MKL_CBWR the raylet's environment already
# sets (the environment of the process that started the cluster) wins.
MKL_REPRODUCIBLE = "AUTO,STRICT"
