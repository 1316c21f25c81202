"""A run's actors as its driver holds them: spawned, connected, restored, started,
stopped and killed.

`RunActors` creates the buffer (`run-<id>-buffer`, beside the driver), the reward workers
(`run-<id>-reward-<k>`), the inference workers (`run-<id>-inference-<k>`), a trainer
pool's ranks 1.. (`run-<id>-trainer-<k>`) and the trainer (`run-<id>-trainer`, rank 0),
not detached, so they die with the driver; all but the buffer in the run's Ray placement
group (workers/run/placement.py: the CPUs and GPUs the config's pools ask for; removed when
the actors are killed, or with the driver). It connects the
trainer's weight sender to the inference workers' receivers, puts a checkpoint into the
actors before their loops start, and at the end stops them in the order that lets the
last weights and the final eval pass through. Every wait gives way to a cancel (the
driver's stop event) and has a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workers.config.run_config import RunConfig
from workers.core.run_actors import (
    NAMESPACE,
    actor_name,
    kill_named,
    placement_group_name,
    run_actor_names,
    where_am_i,
    with_options,
)
from workers.rollout.reward_stage import RewardWorker
from workers.run import placement
from workers.run.actors import BufferActor
from workers.run.buffer import plan as buffer_plan
from workers.run.checkpoints import BUFFER, INFERENCE, Checkpoint, CheckpointRecord, CheckpointTarget
from workers.run.failures import ChildFailed, NodeLost, SyncTimeout
from workers.run.inference_worker import InferenceWorker
from workers.run.ledger import resume_parts
from workers.run.ray_deaths import death
from workers.run.trainer_actors import TrainerActor, TrainerRank

log = logging.getLogger(__name__)

# How often a wait on the run's actors looks for a cancel (and Ray for a node's
# verdict): shorter → a faster cancel, more calls.
CHECK_S = 0.5
# The run's placement group must be placed and its actors up within this (vLLM needs
# ~20–40 s on CPU to start).
SPAWN_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
# Writing the final model: seconds for the tiny model, minutes for a multi-GB checkpoint.
EXPORT_TIMEOUT_S = 3600.0
# An actor Ray cannot reach may be on a node that is being lost: Ray declares a node
# dead after a few missed health checks (seconds to tens of seconds). The driver waits
# this long for that verdict before failing the run for the actor alone.
NODE_VERDICT_S = 45.0
# The causes of an actor's death (workers.run.ray_deaths) that may mean its node is going
# ("": Ray has recorded none yet).
NODE_SIGNS = ("unavailable", "node_died", "process_died", "")
# The final eval pass (eval.every_steps > 0) at the end of a run: its weights' arrival
# (workers.run.inference_worker.FINAL_WEIGHTS_WAIT_S) and the pass itself. Past this the run ends
# without it.
FINAL_EVAL_TIMEOUT_S = 300.0


class RunActors:
    """The actors of run `run_id` and its placement group, once spawned (`spawn`).

    `stop`: the driver's cancel; a wait that sees it set returns False."""

    def __init__(
        self,
        run_id: int,
        cfg: RunConfig,
        scratch_dir: str,
        checkpoints: CheckpointTarget | None,
        trainer_threads: int | None,
        stop: threading.Event,
        replay: dict | None = None,
    ) -> None:
        """`replay`: a recorded schedule the buffer enforces (workers/run/schedule.py)."""
        self.replay = replay
        self.run_id, self.cfg, self.scratch_dir = run_id, cfg, scratch_dir
        self.checkpoints, self.trainer_threads, self._stop = checkpoints, trainer_threads, stop
        self.name = actor_name(run_id)
        self.buffer: Any = None
        self.trainer: Any = None
        self.workers: list = []  # the inference workers
        self.reward_workers: list = []  # the reward stage's pool (rewards.workers; none by default)
        self.ranks: list = []  # a trainer pool's ranks 1.. (the trainer is rank 0)
        self.placement_group: Any = None  # the Ray placement group of the inference, trainer and reward pools
        # Where each actor runs: [{actor, node_id, node_ip, labels, gpu_ids, …}], once up.
        self.placement: list[dict] = []

    # -- start ---------------------------------------------------------------------

    def remove_previous(self) -> None:
        """Kill the run's actors and remove its placement group left by a previous driver."""
        kill_named(run_actor_names(self.run_id, include_driver=False))
        placement.remove_named(placement_group_name(self.run_id))

    def spawn(self, model_dir: str) -> bool:
        """Place the run's placement group and create its actors, ready to start; False
        if cancelled meanwhile, ChildFailed past SPAWN_TIMEOUT_S."""
        cfg, b, w = self.cfg, self.cfg.trainer.batch_groups, self.cfg.inference.num_workers
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        inference_threads, trainer_threads = placement.phase_threads(cfg)
        if self.trainer_threads is not None:
            trainer_threads = self.trainer_threads
        plan = placement.plan(cfg)
        self.placement_group = placement.create(plan, placement_group_name(self.run_id))
        if not self._wait(
            [self.placement_group.ready()],
            deadline,
            f"the cluster could not place the run's actors within {SPAWN_TIMEOUT_S:.0f}s: they ask for "
            f"{plan.summary} (inference.*, trainer.*, rewards.*, placement.*)",
        ):
            return False
        # Sync: batch k only from version k. Async: the buffer mode's head (by default at
        # most max_staleness batches ahead, so admission paces generation instead of
        # generating groups get() would drop).
        # The buffer beside the driver (no GPU, no CPU of its own): it lives as long as
        # the run's control does, whichever node is lost.
        beside_driver = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.buffer = with_options(
            BufferActor, name=f"{self.name}-buffer", namespace=NAMESPACE, scheduling_strategy=beside_driver
        ).remote(buffer_plan(cfg.buffer, cfg.mode, b, cfg.trainer), b, self.replay)
        self.reward_workers = [
            with_options(
                RewardWorker,
                name=f"{self.name}-reward-{k}",
                namespace=NAMESPACE,
                **placement.actor_options(self.placement_group, plan.rewards[k]),
            ).remote(cfg, k)
            for k in range(cfg.rewards.workers)
        ]
        self.workers = [
            with_options(
                InferenceWorker,
                name=f"{self.name}-inference-{k}",
                namespace=NAMESPACE,
                **placement.actor_options(self.placement_group, plan.inference[k]),
            ).remote(cfg, model_dir, k, w, self.buffer, self.scratch_dir, self.reward_workers, inference_threads)
            for k in range(w)
        ]
        # A trainer pool: ranks 1.. first, so that rank 0 (the trainer actor) can form the
        # pool with them while it starts (workers/train/trainer_pool.py).
        self.ranks = [
            with_options(
                TrainerRank,
                name=f"{self.name}-trainer-{k}",
                namespace=NAMESPACE,
                **placement.actor_options(self.placement_group, plan.trainer[k]),
            ).remote(cfg, model_dir, k, trainer_threads)
            for k in range(1, cfg.trainer.num_ranks)
        ]
        self.trainer = with_options(
            TrainerActor,
            name=f"{self.name}-trainer",
            namespace=NAMESPACE,
            **placement.actor_options(self.placement_group, plan.trainer[0]),
        ).remote(
            cfg,
            model_dir,
            self.buffer,
            self.workers,
            trainer_threads,
            self.scratch_dir,
            self.checkpoints,
            ranks=self.ranks,
        )
        if not self._wait(
            [a.ready.remote() for a in (self.buffer, self.trainer, *self.ranks, *self.workers, *self.reward_workers)],
            deadline,
            f"run actors not ready after {SPAWN_TIMEOUT_S:.0f}s, their resources reserved ({plan.summary}): "
            "they are slow to start on this cluster",
        ):
            return False
        self.placement = self._where()
        return True

    def restore(self, location: str) -> int:
        """Put the checkpoint at `location` into the new actors before their loops start:
        the trainer's state, then the buffer's and each inference worker's; the trainer
        publishes the checkpoint's weights first thing when it starts. Returns the
        checkpoint's policy version."""
        ckpt = Checkpoint(location)
        workers = ckpt.load_json(INFERENCE)
        if len(workers) != len(self.workers):
            log.warning(
                "run %s: the checkpoint has %d inference workers' states, this run %d: unmatched ones start "
                "afresh (worker 0 takes the rows the others carried)",
                self.run_id,
                len(workers),
                len(self.workers),
            )
        version = ray.get(self.trainer.restore.remote(location))
        buffer = ckpt.load_json(BUFFER)
        # An inference worker without a state of its own still waits for the checkpoint's
        # weights. Rows in flight when the checkpoint was taken are generated first.
        parts = resume_parts(workers, buffer, len(self.workers))
        ray.get(
            [self.buffer.load_state_dict.remote(buffer)]
            + [w.restore.remote(state, version, rows) for w, (state, rows) in zip(self.workers, parts, strict=True)]
        )
        return version

    def connect_sync(self) -> bool:
        """Connect the trainer's weight sender to every inference worker's receiver, all
        at once (a collective's rendezvous blocks until every rank has joined); False if
        cancelled, SyncTimeout past `sync.timeout_s`."""
        endpoint = ray.get(self.trainer.sync_endpoint.remote())
        pending = [self.trainer.sync_connect.remote()] + [
            w.sync_connect.remote(endpoint, k + 1) for k, w in enumerate(self.workers)
        ]
        deadline = time.monotonic() + self.cfg.sync.timeout_s + CHECK_S
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=CHECK_S)
            ray.get(done)  # raises a side's connect error (e.g. a LoRA base mismatch)
            if self._stop.is_set():
                return False
            if pending and time.monotonic() > deadline:
                raise SyncTimeout(self.cfg.sync.protocol, self.cfg.sync.timeout_s)
        return True

    def start_loops(self) -> None:
        ray.get([self.trainer.start.remote(), *(w.start.remote() for w in self.workers)])

    def _wait(self, pending: list, deadline: float, late: str) -> bool:
        """Wait for every reference in `pending`; False if the run is cancelled meanwhile,
        ChildFailed(`late`) past `deadline`, an actor's constructor error as raised."""
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=CHECK_S)
            ray.get(done)  # raises an actor's constructor error
            if self._stop.is_set():
                return False
            if pending and time.monotonic() > deadline:
                raise ChildFailed(late)
        return True

    # -- where they run ------------------------------------------------------------

    def roles(self) -> list[tuple[str, Any]]:
        """(role, handle) of each of the run's actors but the driver, in the order the run
        page lists them."""
        roles = [("trainer rank 0" if self.ranks else "trainer", self.trainer)]
        roles += [(f"trainer rank {k + 1}", r) for k, r in enumerate(self.ranks)]
        roles += [(f"inference worker {k}", w) for k, w in enumerate(self.workers)]
        roles += [(f"reward worker {k}", w) for k, w in enumerate(self.reward_workers)]
        return [*roles, ("buffer", self.buffer)]

    def _where(self) -> list[dict]:
        """Where each actor runs (its node and devices), the driver first."""
        actors = self.roles()
        found = ray.get([a.where.remote() for _, a in actors])
        return [{"actor": "driver", **where_am_i()}] + [
            {"actor": role, **where} for (role, _), where in zip(actors, found, strict=True)
        ]

    def node_names(self) -> dict[str, str]:
        """Node id → how a message names it: its address and labels."""
        named = {}
        for row in self.placement:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(row.get("labels", {}).items()))
            named[row["node_id"]] = row["node_ip"] + (f", {labels}" if labels else "")
        return named

    def lost_nodes(self, exc: Exception) -> NodeLost | None:
        """The run's nodes Ray has declared dead, as a NodeLost, or None. An actor Ray
        could not reach, or one whose process or node died, may be the first sign of a
        node going (Ray records the node's death a few health checks later): its verdict
        is awaited up to NODE_VERDICT_S; an actor killed, or whose owner died, is not."""
        if not isinstance(exc, ray.exceptions.RayActorError) or death(exc).cause not in NODE_SIGNS:
            return None
        ours = {row["node_id"] for row in self.placement}
        deadline = time.monotonic() + NODE_VERDICT_S
        while True:
            dead = {n["NodeID"] for n in ray.nodes() if n["NodeID"] in ours and not n.get("Alive")}
            if dead or time.monotonic() > deadline:
                break
            time.sleep(CHECK_S)
        if not dead:
            return None
        names = self.node_names()
        nodes = [f"{names.get(node, 'a node')} (Ray node {node[:12]})" for node in sorted(dead)]
        actors = [row["actor"] for row in self.placement if row["node_id"] in dead]
        return NodeLost(nodes, actors)

    # -- the end -------------------------------------------------------------------

    def stop(self, version: int, evaluate: bool) -> None:
        """Stop the trainer first, its sender open, so the step and the weights it is
        sending finish while the inference workers still receive (a collective's
        receivers closing under a broadcast would fail it); then the inference workers,
        worker 0 running the final eval pass on those weights as it stops if `evaluate`
        (workers.rollout.evaluation); then close the sender. `version`: the newest the driver
        saw, for a trainer that cannot say its own."""
        if self.trainer is None:
            return
        try:
            final = ray.get(self.trainer.stop.remote(keep_sender=True), timeout=STOP_TIMEOUT_S)
        except Exception:  # a dead or stuck trainer: the final pass runs on inference worker 0's newest weights
            log.warning("run %s: no final version from the trainer", self.run_id, exc_info=True)
            final = version
        calls = [
            w.stop.remote(final_eval_version=final if k == 0 and evaluate else None) for k, w in enumerate(self.workers)
        ]
        ray.wait(calls, num_returns=len(calls), timeout=STOP_TIMEOUT_S + (FINAL_EVAL_TIMEOUT_S if evaluate else 0))
        ray.wait([self.trainer.close_sender.remote()], timeout=STOP_TIMEOUT_S)

    def policy_checksum(self) -> str:
        """The final weights' checksum; "" if the trainer cannot say (the run's outcome
        does not depend on it)."""
        try:
            return ray.get(self.trainer.policy_checksum.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # a dead or stuck trainer after its last step: any error means no checksum
            log.warning("run %s: no checksum of the final policy", self.run_id, exc_info=True)
            return ""

    def schedule(self) -> dict:
        """The schedule the buffer recorded (workers.run.schedule.schedule_json); {} if it
        cannot say."""
        try:
            return ray.get(self.buffer.schedule.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # as ledger: the run's outcome does not depend on it
            log.warning("run %s: no schedule", self.run_id, exc_info=True)
            return {}

    def ledger(self) -> dict[str, float]:
        """The prompt ledger's totals once the loops have stopped; {} if the trainer
        cannot say (the run's outcome does not depend on it)."""
        try:
            return ray.get(self.trainer.ledger.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # as policy_checksum: a dead or stuck trainer after its last step
            log.warning("run %s: no prompt ledger", self.run_id, exc_info=True)
            return {}

    def checkpoint(self) -> CheckpointRecord | None:
        """Have the trainer write a checkpoint now, the loops stopped; None if its last
        step has one already."""
        return ray.get(self.trainer.checkpoint.remote(), timeout=EXPORT_TIMEOUT_S)

    def export(self, target: str) -> None:
        """Have the trainer, which holds the weights, write the final policy at `target`."""
        ray.get(self.trainer.export.remote(target), timeout=EXPORT_TIMEOUT_S)

    def kill(self) -> None:
        """Kill the run's actors and give their placement group's resources back."""
        for a in (self.trainer, *self.ranks, *self.workers, *self.reward_workers, self.buffer):
            if a is not None:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(a, no_restart=True)
        if self.placement_group is not None:
            with contextlib.suppress(Exception):  # already removed
                placement.remove(self.placement_group)
            self.placement_group = None
