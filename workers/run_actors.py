"""A run's actors in Ray, by name: `run-<id>` (the driver, detached) and
`run-<id>-<role>` (buffer, trainer, inference-<k>), all in namespace "rollway".

Names are how a run is found again from any process (a redelivered Celery task, the
reconcile beat, a new driver replacing a dead one), so they are built in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

import ray

NAMESPACE = "rollway"

A = TypeVar("A")


def actor_name(run_id: int) -> str:
    """The driver actor's name; the run's other actors extend it with `-<role>`."""
    return f"run-{run_id}"


def placement_group_name(run_id: int) -> str:
    """The name of the run's Ray placement group (workers/placement.py), owned by its driver."""
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
    """`@ray.remote(**options)` for an actor class. Ray's typed signature lists a remote
    function's options only (not an actor's `max_concurrency`), and the class it returns
    has `.options` / `.remote`, which a type checker cannot see: `with_options` calls them."""
    return cast(Any, ray.remote)(**options)


def with_options(actor: type, **options: Any) -> Any:
    """`actor.options(**options)` of an `actor_class` class: what `.remote(...)` then creates."""
    return cast(Any, actor).options(**options)
