"""Rollway's engine: everything that runs on the Ray cluster. Never imports Django.

In a Ray worker, importing the engine first sets the process up as a run's
(workers.core.worker_process): Ray imports an actor's class by its module, so this runs
before the actor's module imports torch or transformers, on any cluster.
"""

from workers.core import worker_process

if worker_process.in_ray_worker():
    worker_process.setup_ray_worker()
