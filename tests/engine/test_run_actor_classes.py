"""workers.core.run_actors.ACTOR_CLASSES, which tools that read processes (bench/run_cost.py,
the end-to-end tests' check for runs left running) look for: it names every Ray actor
class a run starts, and nothing else."""

from __future__ import annotations

import ray.actor

from workers.core.run_actors import ACTOR_CLASSES
from workers.run import driver, spawn


def test_actor_classes_are_the_ray_actor_classes_a_run_starts():
    found = {
        name
        for module in (driver, spawn)
        for name, value in vars(module).items()
        if isinstance(value, ray.actor.ActorClass)
    }
    assert found == set(ACTOR_CLASSES), (sorted(found), ACTOR_CLASSES)
