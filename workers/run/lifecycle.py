"""The run lifecycle as the platform sees it: connect to Ray, launch, cancel, is_alive,
and the cluster's resources (in total, and free now).

A run lives in Ray as the detached driver actor `run-<id>` (workers.run.driver), so the
Celery task that launches it stays short and a redelivered task finds the run instead
of starting it twice. These calls are all the platform needs of Ray; each is idempotent.
"""

from __future__ import annotations

import os
import socket
import time

import ray

from workers.config.run_config import RunConfig
from workers.core.run_actors import NAMESPACE, actor_name, get_actor, kill_named, run_actor_names, with_options
from workers.run.admission import Capacity, gpu_memory_of
from workers.run.checkpoints import check_resume
from workers.run.driver import RunDriver
from workers.run.failures import RayUnreachable
from workers.run.paths import Confinement
from workers.run.runnable import check_runnable

# The driver's constructor and start() only set up a thread: seconds, even on a busy host.
LAUNCH_TIMEOUT_S = 60.0
# A head that is up accepts a TCP connection in milliseconds, even on a busy host.
PROBE_TIMEOUT_S = 2.0


def connect(ray_address: str | None = None) -> None:
    """Join Ray if this process has not: `ray_address`, else RAY_ADDRESS, else a new
    local cluster (which lives only as long as this process: fine for tests, not for a
    platform; there the launcher's `ray start --head` sets RAY_ADDRESS).

    With an address, the head is probed first (`RayUnreachable` if it does not answer),
    joined or not: a Ray call to a head that vanished blocks until Ray gives up on it
    (60 s) and then ends the whole process, a Celery worker included. A process joined
    to a vanished head leaves it (`ray.shutdown`, about 5 s), so that the call after the
    head is back joins it afresh."""
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address and not _answers(address):
        if ray.is_initialized():
            ray.shutdown()
        raise RayUnreachable(address)
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)


def _answers(address: str) -> bool:
    """Whether `host:port` accepts a TCP connection within PROBE_TIMEOUT_S; an address
    this cannot probe (`auto`, a `ray://` client address) counts as answering."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def launch(
    run_id: int,
    config: RunConfig | dict,
    *,
    ingest_url: str,
    token: str,
    cache_dir: str,
    ray_address: str | None = None,
    confinement: Confinement | None = None,
    resume_from: str | None = None,
    env: dict[str, str] | None = None,
    replay: dict | None = None,
) -> str:
    """Create (or find) the detached driver actor `run-<run_id>` and start the run of
    `config` (the site hands it over validated; a dict is validated here).

    Idempotent: launching a run whose driver is alive only finds it. Returns the actor
    name once the driver has started (seconds); the run goes on inside Ray. Raises
    pydantic.ValidationError for a bad config. A driver that already finished has exited,
    so launching its run again starts it afresh: check the run's state first.
    `confinement`: where the run may read and write (the site's settings).
    `resume_from`: a checkpoint's location (its step directory, workers/run/checkpoints.py)
    to continue from, of this run or another; CheckpointRefused (a ValueError naming
    `resume_from`) if it is outside `confinement.checkpoint_root` or incomplete.
    `env`: environment variables the driver starts with and its actors inherit (Ray's
    runtime_env, beside the raylet's environment; each of the run's actors then starts
    through one more process, workers.core.worker_process): a test hook's switch, or
    NCCL_DEBUG for one run. The site passes none."""
    cfg = check_runnable(config if isinstance(config, RunConfig) else RunConfig.model_validate(config))
    if resume_from is not None:
        resume_from = check_resume(resume_from, confinement.checkpoint_root if confinement else "")
    connect(ray_address)
    driver = with_options(
        RunDriver,
        name=actor_name(run_id),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=0,
        **on_the_head(),
        **({"runtime_env": {"env_vars": env}} if env else {}),
    ).remote(
        run_id,
        cfg.model_dump(mode="json"),
        ingest_url,
        token,
        cache_dir,
        confinement=confinement,
        resume_from=resume_from,
        replay=replay,
    )
    return ray.get(driver.start.remote(), timeout=LAUNCH_TIMEOUT_S)


# Ray gives its head node this resource (and no other node): how the head is asked for.
HEAD_RESOURCE = "node:__internal_head__"


def on_the_head() -> dict:
    """`.options` that put a run's driver on the head node. A driver on the head outlives
    Ray's worker nodes, so a lost node fails its run with a sentence naming the node, or
    resumes it, instead of losing the run with its driver. Asked as a sliver of the
    head's own resource (hard: Ray 2.60 placed actors soft-pinned to a node elsewhere
    half of the time); {} where the cluster names no head."""
    return {"resources": {HEAD_RESOURCE: 0.001}} if HEAD_RESOURCE in ray.cluster_resources() else {}


def cancel(run_id: int, *, ray_address: str | None = None, timeout_s: float = 10.0) -> bool:
    """Stop run `run_id` and every actor it created; True if there was one.

    Asks the driver to stop gracefully for up to half of `timeout_s`, then kills whatever
    `run-<id>*` actor is left, and waits until none is alive. Raises TimeoutError naming
    the survivors if some outlive `timeout_s`."""
    connect(ray_address)
    deadline = time.monotonic() + timeout_s
    names = run_actor_names(run_id)
    if not names:
        return False
    driver = get_actor(actor_name(run_id))
    if driver is not None:
        try:
            ray.get(driver.stop.remote(), timeout=max(0.1, timeout_s / 4))
            grace = time.monotonic() + timeout_s / 2
            while run_actor_names(run_id) and time.monotonic() < grace:
                time.sleep(0.1)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
    while True:
        left = run_actor_names(run_id)
        if not left:
            return True
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id}: actors still alive after {timeout_s}s: {left}")
        kill_named(left)
        time.sleep(0.1)


def is_alive(run_id: int, *, ray_address: str | None = None) -> bool:
    """Whether the driver actor of run `run_id` exists and answers (or is busy)."""
    connect(ray_address)
    driver = get_actor(actor_name(run_id))
    if driver is None:
        return False
    try:
        ray.get(driver.ping.remote(), timeout=5.0)
    except ray.exceptions.GetTimeoutError:
        return True  # alive but its call slots are busy
    except ray.exceptions.RayActorError:
        return False
    return True


def cluster_capacity(*, ray_address: str | None = None) -> Capacity:
    """What the cluster has in total (not what is free now): a run that needs more
    can never start, so admission refuses it."""
    connect(ray_address)
    total = ray.cluster_resources()
    return Capacity(
        cpus=float(total.get("CPU", 0.0)),
        memory_bytes=int(total.get("memory", 0)),
        gpus=float(total.get("GPU", 0.0)),
        gpu_memory_bytes=gpu_memory_of(total),
    )


def available_capacity(*, ray_address: str | None = None) -> Capacity:
    """What the cluster has free now (Ray's `available_resources()`): the run queue
    admits a run only when this covers what it asks for."""
    connect(ray_address)
    free = ray.available_resources()
    return Capacity(
        cpus=float(free.get("CPU", 0.0)), memory_bytes=int(free.get("memory", 0)), gpus=float(free.get("GPU", 0.0))
    )
