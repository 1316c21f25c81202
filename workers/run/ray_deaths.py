"""What Ray recorded of a run actor's death, read from its actor table.

A RayActorError carries the dead actor's id (`actor_id`) and two flags
(`actor_init_failed`, `preempted`); the rest (the actor's name, its node, why it died)
Ray keeps in its actor table (the GCS's `ActorTableData`: `name`, `address.node_id`
and the `ActorDeathCause` proto), which `death` reads by that id. The exception's own
text is never read.

Ray's public state API (ray.util.state) answers through the dashboard, which a
cluster may run without (the tests' does); `ray._private.state.actors` asks the GCS
itself, as `ray.nodes()` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray
from ray._private import state
from ray.core.generated.common_pb2 import (  # type: ignore[attr-defined]  # generated, without stubs
    ActorDiedErrorContext,
    NodeDeathInfo,
)

# Ray marks an actor DEAD in its table before it tells the actor's callers, but a call
# may fail while its actor is still being torn down: the record is awaited this long.
DEATH_RECORD_S = 2.0
POLL_S = 0.1


def role_of(name: str) -> str:
    """How people call the run actor Ray knows as `name` (workers.core.run_actors names
    them): "run-7-inference-1" → "inference worker 1", "run-7" → "driver"; "" for an
    actor that is not a run's."""
    parts = name.split("-", 2)
    if len(parts) < 2 or parts[0] != "run" or not parts[1].isdigit():
        return ""
    if len(parts) == 2:
        return "driver"
    role, _, k = parts[2].partition("-")
    named = {"inference": "inference worker", "trainer": "trainer rank", "reward": "reward worker"}
    if k.isdigit() and role in named:
        return f"{named[role]} {k}"
    return parts[2] if parts[2] in ("buffer", "trainer") else ""


@dataclass(frozen=True)
class ActorDeath:
    """A run actor Ray reports dead or unreachable: its Ray `name` and `role`
    (`role_of`), the `node_id` it ran on, and `cause`: killed,
    owner_died, node_died, preempted, process_died (with Ray's `exit_detail`),
    out_of_memory (Ray's memory monitor), init_failed (its constructor raised),
    unavailable, or "" when Ray gave no reason."""

    name: str = ""
    role: str = ""
    node_id: str = ""
    cause: str = ""
    exit_detail: str = ""


def death(err: ray.exceptions.RayActorError) -> ActorDeath:
    """What Ray recorded of the death of the actor `err` is about."""
    info = actor_info(err.actor_id, wait=isinstance(err, ray.exceptions.ActorDiedError))
    return death_of(err, info)


def actor_info(actor_id: str | None, wait: bool = True) -> dict | None:
    """The actor table's entry of `actor_id` (Name, Address, State, DeathCause, …);
    None if Ray has none (or cannot be asked)."""
    if not actor_id or not ray.is_initialized():
        return None
    deadline = time.monotonic() + (DEATH_RECORD_S if wait else 0.0)
    while True:
        try:
            info = state.actors(actor_id)
        except Exception:  # no GCS to ask (this process left Ray): the exception's flags remain
            return None
        if not info or info.get("State") == "DEAD" or time.monotonic() >= deadline:
            return info or None
        time.sleep(POLL_S)


def death_of(err: ray.exceptions.RayActorError, info: dict | None) -> ActorDeath:
    """`err` read with the actor table's entry of its actor (`info`, or None)."""
    name = (info or {}).get("Name", "")
    node_id = (info or {}).get("Address", {}).get("NodeID", "")
    cause, detail = _cause(info.get("DeathCause") if info else None)
    if isinstance(err, ray.exceptions.ActorUnavailableError):
        cause = "unavailable"
    elif not cause:
        cause = "preempted" if err.preempted else "init_failed" if err.actor_init_failed else ""
    return ActorDeath(name=name, role=role_of(name), node_id=node_id, cause=cause, exit_detail=detail)


_REASONS = {
    ActorDiedErrorContext.RAY_KILL: "killed",
    ActorDiedErrorContext.OWNER_DIED: "owner_died",
    ActorDiedErrorContext.NODE_DIED: "node_died",
    ActorDiedErrorContext.WORKER_DIED: "process_died",
}


def _cause(death_cause) -> tuple[str, str]:
    """(cause, exit detail) of an `ActorDeathCause` proto."""
    if death_cause is None:
        return "", ""
    which = death_cause.WhichOneof("context")
    if which == "oom_context":
        return "out_of_memory", ""
    if which == "creation_task_failure_context":
        return "init_failed", ""
    if which != "actor_died_error_context":
        return "", ""
    ctx = death_cause.actor_died_error_context
    if ctx.node_death_info.reason == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED:
        return "preempted", ""
    cause = _REASONS.get(ctx.reason, "")
    if cause != "process_died":
        return cause, ""
    # Ray keeps a dead worker's exit type and detail only inside its error_message
    # ("... Worker exit type: SYSTEM_ERROR Worker exit detail: <detail>"): no field.
    before, _, detail = ctx.error_message.partition("Worker exit detail: ")
    if "NODE_OUT_OF_MEMORY" in before:
        return "out_of_memory", ""
    return cause, detail.strip()
