"""What the two-node tests do in Ray, in a process of their own.

Ray keeps per-process state that a pytest process which already ran an in-process
cluster cannot shed: its auth mode, read once on import, and what it exported to the
clusters it joined (a driver created after joining a second cluster never ran). So each
call of this module joins the cluster at RAY_ADDRESS afresh, as the platform's Celery
worker does, and prints its answer as JSON on a line that starts with RESULT.

    python -m tests.engine.multinode_runner run '{"run_id": 1, "preset": "sync", "config": {}, "cache_dir": "…"}'
    python -m tests.engine.multinode_runner launch '{…, "ingest_url": "…", "token": "…"}'
    python -m tests.engine.multinode_runner left '{"run_id": 1}'
"""

from __future__ import annotations

import json
import os
import sys

import ray

from workers.config.presets import build
from workers.core.run_actors import NAMESPACE, actor_name, placement_group_name, run_actor_names
from workers.run.driver import RunDriver
from workers.run.lifecycle import launch, on_the_head
from workers.run.paths import Confinement


def run(spec: dict) -> dict:
    """A run driven to its end by a driver on the head; its summary."""
    cfg = build(spec["preset"], spec["config"]).model_dump(mode="json")
    driver = RunDriver.options(name=actor_name(spec["run_id"]), namespace=NAMESPACE, **on_the_head()).remote(
        spec["run_id"], cfg, None, "", spec["cache_dir"], exit_when_done=False
    )
    try:
        return ray.get(driver.run.remote(), timeout=600)
    finally:
        ray.kill(driver)


def launch_detached(spec: dict) -> dict:
    """A run launched as the platform launches it (a detached driver); returns at once.
    `checkpoint_root` (optional): where it writes its checkpoints; `resume_from`
    (optional): the checkpoint it resumes from."""
    cfg = build(spec["preset"], spec["config"]).model_dump(mode="json")
    # As a driver lays out a run given no confinement, with the checkpoint root added.
    confinement = Confinement(
        scratch_root=os.path.join(spec["cache_dir"], "scratch"),
        export_root=os.path.join(spec["cache_dir"], "exports"),
        checkpoint_root=spec.get("checkpoint_root", ""),
    )
    name = launch(
        spec["run_id"],
        cfg,
        ingest_url=spec["ingest_url"],
        token=spec["token"],
        cache_dir=spec["cache_dir"],
        confinement=confinement,
        resume_from=spec.get("resume_from"),
    )
    return {"driver": name}


def left(spec: dict) -> dict:
    """What is left of a run in the cluster: its actors, its placement group's states."""
    name = placement_group_name(spec["run_id"])
    groups = [g["state"] for g in ray.util.placement_group_table().values() if g["name"] == name]
    return {"actors": run_actor_names(spec["run_id"]), "groups": groups}


def main(verb: str, spec: str) -> None:
    ray.init(namespace=NAMESPACE, log_to_driver=False)  # RAY_ADDRESS: the cluster under test
    try:
        answer = {"run": run, "launch": launch_detached, "left": left}[verb](json.loads(spec))
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
