"""A run's actors in Ray, by name: `run-<id>` (the driver, detached) and
`run-<id>-<role>` (buffer, trainer, inference-<k>), all in namespace "rollway".

Names are how a run is found again from any process (a redelivered Celery task, the
reconcile beat, a new driver replacing a dead one), so they are built in one place.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import ray

from workers.core import worker_process

NAMESPACE = "rollway"
# The classes of a run's Ray actors. Ray titles an actor's process `ray::<Class>` (after
# `ray::<name>:` while its constructor runs), so tools that read processes rather than
# Ray (a bench's CPU table, a test's check for runs left running) find a run by these.
ACTOR_CLASSES = ("RunDriver", "InferenceWorker", "TrainerActor", "TrainerRank", "BufferActor", "RewardWorker")

A = TypeVar("A")


# A file that processes starting Ray clusters on one host lock in turn while each starts
# (unset: no lock). Ray gives a new raylet 30 s to register with its GCS (a constant of
# ray._private.node, no setting), and on a loaded 2-core host two clusters starting at
# once missed it: a test suite's workers and the bench scripts they run share one.
RAY_START_LOCK_ENV = "ROLLWAY_RAY_START_LOCK"


@contextlib.contextmanager
def ray_start_lock(path: str | None = None) -> Iterator[None]:
    """Hold the start lock at `path` (default: RAY_START_LOCK_ENV's; none if unset)."""
    path = path or os.environ.get(RAY_START_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def init_local_ray(namespace: str, num_cpus: int = 2) -> None:
    """A Ray cluster of this process's own (address "local": even where RAY_ADDRESS or a
    `ray start` on this host names another one): what the bench scripts measure on.
    Started under the host's start lock, where RAY_START_LOCK_ENV names one."""
    with ray_start_lock():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, namespace=namespace, log_to_driver=False)


def actor_name(run_id: int) -> str:
    """The driver actor's name; the run's other actors extend it with `-<role>`."""
    return f"run-{run_id}"


def placement_group_name(run_id: int) -> str:
    """The name of the run's Ray placement group (workers/run/placement.py), owned by its driver."""
    return f"{actor_name(run_id)}-placement"


def run_actor_names(run_id: int, include_driver: bool = True) -> list[str]:
    """Names of the live actors of run `run_id` in the rollway namespace."""
    base = actor_name(run_id)
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and ((include_driver and a["name"] == base) or a["name"].startswith(base + "-"))
    )


def get_actor(name: str):
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def kill_named(names: list[str]) -> None:
    for name in names:
        handle = get_actor(name)
        if handle is not None:
            with contextlib.suppress(Exception):  # died meanwhile
                ray.kill(handle, no_restart=True)


def actor_class(**options: Any) -> Callable[[type[A]], type[A]]:
    """`@ray.remote(**options)` for an actor class whose constructor runs on the threads
    Ray gave it (`worker_process.take_rays_threads`) and, once it returns (or raises),
    ends its process's start-up (`worker_process.started`). Ray's typed signature
    lists a remote function's options only (not an actor's `max_concurrency`), and the
    class it returns has `.options` / `.remote`, which a type checker cannot see:
    `with_options` calls them."""

    def make(cls: type[A]) -> type[A]:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            worker_process.take_rays_threads()
            try:
                init(self, *args, **kwargs)
            finally:
                worker_process.started()

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cast(Any, ray.remote)(**options)(cls)

    return make


def with_options(actor: type, **options: Any) -> Any:
    """`actor.options(**options)` of an `actor_class` class: what `.remote(...)` then creates."""
    return cast(Any, actor).options(**options)


def where_am_i() -> dict:
    """This actor's node and devices, as the run page shows them: Ray's node id, its
    address and labels, and the GPU ids Ray gave it (with CUDA_VISIBLE_DEVICES)."""
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    labels: dict = {}
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            labels = {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}
            break
    return {
        "node_id": node_id,
        "node_ip": ray.util.get_node_ip_address(),
        "labels": labels,
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "pid": os.getpid(),
        "threads": _torch_threads(),
    }


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process, or None where torch is not loaded (the
    driver, the buffer): importing it here would cost those processes seconds."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None
