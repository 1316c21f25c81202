"""The run driver: the detached Ray actor `run-<id>` that is one run.

The platform starts and stops it through workers.lifecycle. The driver builds (or
finds) the warm-started policy, creates the run's actors (`run-<id>-buffer`,
`run-<id>-inference-<k>`, `run-<id>-trainer`; not detached, so they die with the
driver) in the run's Ray placement group (workers/placement.py: the CPUs and GPUs the
config's pools ask for; removed when the actors stop, or with the driver), starts their
loops and supervises them: every POLL_S it drains their metrics, reports them through
the `MetricsReporter` (one point per series per trainer step, step = policy version)
and checks the stop conditions.

Status goes to the platform as running → succeeded | failed (with a sentence saying why
and the traceback it was worked out from: workers.failures). A
cancelled run posts no terminal status: the platform set "cancelled" itself. While
running, each change of phase goes with the status (workers.reporter.PHASES): warm_start
(with the supervised steps done when it builds the policy), starting_engines,
first_step, stepping; start-up can take a minute before the first point.

Checkpoints (workers/checkpoints.py, `checkpoint` in the config): the trainer writes one
every `every_steps` steps, the driver has it write one more when the run stops as
planned, and each is announced to the site; a driver given `resume_from` restores one
into its new actors before their loops start and continues from its step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import defaultdict, deque
from functools import partial

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workers import placement
from workers.actors import BufferActor, InferenceWorker, TrainerActor, TrainerRank, where_am_i
from workers.admission import engine_errors
from workers.buffer import plan as buffer_plan
from workers.checkpoints import (
    BUFFER,
    INFERENCE,
    Checkpoint,
    CheckpointRecord,
    CheckpointTarget,
    check_resume,
)
from workers.config import RunConfig, StopConfig
from workers.failures import ChildFailed, NodeLost, SyncTimeout, explain
from workers.messages import InferenceReport, TrainerReport
from workers.metric_names import REWARD_WINDOW
from workers.partial_rollouts import partial_metrics
from workers.paths import Confinement, make_scratch, remove_scratch
from workers.reporter import MetricsReporter
from workers.run_actors import NAMESPACE, actor_name, kill_named, placement_group_name, run_actor_names
from workers.timeline import StepWindows

log = logging.getLogger(__name__)

# Metrics poll period: shorter → fresher charts, more actor calls (≈1 ms each).
POLL_S = 0.5
# target_reward is judged on the mean reward/mean of this many latest steps.
TARGET_WINDOW = REWARD_WINDOW
# The driver keeps this many latest points of each series for its summary (the site
# stores them all). Keeping every point grew a fast run's driver without bound: a tiny
# run's 22 steps/s × 28 series is 1.1M points, ~105 MB, in 30 minutes.
SERIES_TAIL = 2_000
# The run's placement group must be placed and its actors up within this (vLLM needs
# ~20–40 s on CPU to start).
SPAWN_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
# At the end the driver retries the site this long for the last points and the final
# status before it exits (what is left stays in the spool): longer keeps a finished run
# from looking lost to the platform's reconcile while the site restarts.
FINAL_FLUSH_S = 30.0
CANCEL_FLUSH_S = 2.0
# Warm-start progress is posted at most this often: each post is an HTTP round trip.
PHASE_PROGRESS_S = 1.0
# Writing the final model: seconds for the tiny model, minutes for a multi-GB checkpoint.
EXPORT_TIMEOUT_S = 3600.0
# An actor Ray cannot reach may be on a node that is being lost: Ray declares a node
# dead after a few missed health checks (seconds to tens of seconds). The driver waits
# this long for that verdict before failing the run for the actor alone.
NODE_VERDICT_S = 45.0
# The final eval pass (eval.every_steps > 0) at the end of a run: its weights' arrival
# (workers.actors.FINAL_WEIGHTS_WAIT_S) and the pass itself. Past this the run ends
# without it.
FINAL_EVAL_TIMEOUT_S = 300.0


@ray.remote(num_cpus=0, max_concurrency=8)
class RunDriver:
    """One run: spawns the actors, supervises them, reports metrics and status."""

    def __init__(
        self,
        run_id: int,
        config: dict,
        ingest_url: str | None,
        token: str,
        cache_dir: str,
        exit_when_done: bool = True,
        trainer_threads: int | None = None,
        confinement: Confinement | None = None,
        resume_from: str | None = None,
    ) -> None:
        """`config` is validated here, once; the actors get the validated sections.
        `confinement`: where the run may read and write (workers/paths.py); without one,
        no config path is allowed and the scratch goes under `cache_dir`. `resume_from`:
        a checkpoint (a step directory under `confinement.checkpoint_root`, of this run
        or another) to continue from (workers/checkpoints.py)."""
        self.run_id = run_id
        self.name = actor_name(run_id)
        self.cfg = RunConfig.model_validate(config)
        self.cache_dir = cache_dir
        self.confinement = confinement or Confinement(
            scratch_root=os.path.join(cache_dir, "scratch"), export_root=os.path.join(cache_dir, "exports")
        )
        self.scratch_dir = self.confinement.scratch_dir(run_id)
        self.resume_from = resume_from
        self.checkpoints = self._checkpoint_target()
        self.exit_when_done = exit_when_done
        self.trainer_threads = trainer_threads
        self.reporter = MetricsReporter(run_id, ingest_url, token, cache_dir)
        self.state = "created"  # created → starting → running → succeeded | failed | cancelled
        self.reason = ""
        self.error = ""  # why it failed, for people (workers.failures)
        self.error_detail = ""  # the traceback behind `error`
        self.version = 0
        self.series: defaultdict[str, deque[tuple[int, float]]] = defaultdict(partial(deque, maxlen=SERIES_TAIL))
        self.buffer = self.trainer = None
        self.workers: list = []
        self.ranks: list = []  # a trainer pool's ranks 1.. (the trainer is rank 0)
        # Where each actor runs: [{actor, node_id, node_ip, labels, gpu_ids, …}], once up.
        self.placement: list[dict] = []
        self.placement_group = None  # the Ray placement group of the inference workers and the trainer
        self._windows = StepWindows(self.cfg.inference.num_workers)
        self._pending_windows: list[tuple[int, float, float]] = []  # (step, t0, t1)
        self._syncs: dict[int, list] = defaultdict(list)  # version → SyncReport per worker
        self._loop_started = 0.0
        self.timings: dict[str, float] = {}  # seconds per phase: warm_start, spawn, loops
        self.policy_sha256 = ""  # of the trainer's final weights, once the loops have stopped
        self.export_dir = ""  # where the final policy was exported (workers/export.py)
        self.checkpoints_written: list[CheckpointRecord] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.phase = ""
        self._phase_posted_at = 0.0

    # -- control -------------------------------------------------------------------

    def start(self) -> str:
        """Start the run in a background thread (idempotent); returns the actor name."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="run", daemon=True)
            self._thread.start()
        return self.name

    def stop(self) -> None:
        """Graceful cancel: the run loop stops its actors and flushes its metrics."""
        self._stop.set()

    def ping(self) -> dict:
        return {"state": self.state, "version": self.version, "reason": self.reason, "error": self.error}

    def exit(self) -> None:
        ray.actor.exit_actor()

    def _main(self) -> None:
        self.run()
        if self.exit_when_done:
            # exit_actor() must run as a task of this actor, not in this thread.
            ray.get_runtime_context().current_actor.exit.remote()

    # -- the run -------------------------------------------------------------------

    def run(self) -> dict:
        """Run to completion (blocking) and return the summary; see `summary()`."""
        self.state = "starting"
        self._set_phase("warm_start", "loading the warm-started policy")
        try:
            # Again here, not only at launch: a symlink may have changed since.
            self.confinement.check(self.cfg)
            refused = engine_errors(self.cfg)  # the platform refuses these at launch; a direct launch is not
            if refused:
                raise ValueError("; ".join(refused.values()))
            if self.resume_from is not None:
                self.resume_from = check_resume(self.resume_from, self.confinement.checkpoint_root)
            make_scratch(self.scratch_dir)
            t0 = time.perf_counter()
            from workers.warmstart import policy_dir  # torch + transformers: only here

            model_dir = policy_dir(self.cfg, self.cache_dir, self._warm_start_progress)
            self.timings["warm_start"] = time.perf_counter() - t0
            if self._spawn(model_dir):
                self.timings["spawn"] = time.perf_counter() - t0 - self.timings["warm_start"]
                self.state = "running"
                self.reason = self._supervise()
                self.timings["loops"] = time.time() - self._loop_started
                t1 = time.perf_counter()
                self._stop_children()
                self._collect()
                self.policy_sha256 = self._policy_checksum()
                self.timings["stop"] = time.perf_counter() - t1
                if self.reason != "cancelled":
                    self._final_checkpoint()
                    self._export()
            else:  # cancelled before the loops ran: nothing to drain, just kill
                self.reason = "cancelled"
            if self.reason == "cancelled":
                self.state = "cancelled"
            else:
                self.state = "succeeded"
                self.reporter.post_status("succeeded")
        except Exception as exc:
            self.state, self.reason = "failed", "error"
            failure = explain(exc, self.cfg, phase=self.phase, nodes=self._node_names())
            self.error, self.error_detail = failure.message, failure.detail
            log.error("run %s failed: %s\n%s", self.run_id, self.error, self.error_detail)
            self.reporter.post_status("failed", self.error, error_detail=self.error_detail, error_kind=failure.kind)
        finally:
            self._kill_children()
            remove_scratch(self.scratch_dir)
            # A cancel waits on this: the points it cannot send now stay in the spool.
            self.reporter.close(timeout_s=CANCEL_FLUSH_S if self.reason == "cancelled" else FINAL_FLUSH_S)
        return self.summary()

    def _export(self) -> None:
        """The final policy as a Hugging Face directory in the run's export directory
        (workers/export.py): written by the trainer, which holds the weights. A run whose
        model cannot be exported has not delivered what it was for, so it fails."""
        target = self.confinement.export_dir(self.run_id)
        if target is None:
            return
        t0 = time.perf_counter()
        ray.get(self.trainer.export.remote(target), timeout=EXPORT_TIMEOUT_S)
        self.export_dir = target
        self.timings["export"] = time.perf_counter() - t0

    def _checkpoint_target(self) -> CheckpointTarget | None:
        """Where the trainer writes this run's checkpoints; None when it writes none."""
        ck = self.cfg.checkpoint
        if not (ck.every_steps or ck.at_end):
            return None
        if not self.confinement.checkpoint_root:
            log.warning("run %s: no checkpoints are written: this site has no checkpoint root", self.run_id)
            return None
        return CheckpointTarget(self.confinement.checkpoint_root, self.run_id, ck.every_steps, ck.keep_last)

    def _final_checkpoint(self) -> None:
        """The checkpoint of a run that stopped as planned (checkpoint.at_end), written by
        the trainer once the loops have stopped; skipped if its last step has one."""
        if self.checkpoints is None or not self.cfg.checkpoint.at_end:
            return
        t0 = time.perf_counter()
        record = ray.get(self.trainer.checkpoint.remote(), timeout=EXPORT_TIMEOUT_S)
        if record is not None:
            self._report_checkpoint(record)
        self.timings["checkpoint"] = time.perf_counter() - t0

    def _report_checkpoint(self, record: CheckpointRecord) -> None:
        self.checkpoints_written.append(record)
        self.reporter.post_checkpoint(record.step, record.location, record.bytes, record.sha256, record.pruned)

    def _restore(self) -> None:
        """Put the checkpoint at `resume_from` into the new actors before their loops
        start: the trainer's state, then the buffer's and each worker's; the trainer
        publishes the checkpoint's weights first thing when it starts."""
        ckpt = Checkpoint(self.resume_from)
        workers = ckpt.load_json(INFERENCE)
        if len(workers) != len(self.workers):
            log.warning(
                "run %s: the checkpoint has %d inference workers' states, this run %d: unmatched ones start afresh",
                self.run_id,
                len(workers),
                len(self.workers),
            )
        self.version = ray.get(self.trainer.restore.remote(self.resume_from))
        # A worker without a state of its own still waits for the checkpoint's weights.
        states = workers[: len(self.workers)] + [None] * (len(self.workers) - len(workers))
        ray.get(
            [self.buffer.load_state_dict.remote(ckpt.load_json(BUFFER))]
            + [w.restore.remote(state, self.version) for w, state in zip(self.workers, states, strict=True)]
        )

    def _set_phase(self, phase: str, detail: str = "") -> None:
        """Tell the site what the run is doing now (with the status, which stays running)."""
        self.phase = phase
        self._phase_posted_at = time.monotonic()
        self.reporter.post_status("running", phase=phase, detail=detail)

    def _warm_start_progress(self, done: int, total: int) -> None:
        if done == total or time.monotonic() - self._phase_posted_at >= PHASE_PROGRESS_S:
            self._set_phase("warm_start", f"building the warm-started policy: step {done}/{total}")

    def summary(self) -> dict:
        """state, reason, error (a sentence), error_detail (its traceback), steps,
        wall_s (of the loops), timings (seconds per phase), policy_sha256 (the final
        weights' checksum: equal for bit-identical policies), export_dir (where the final
        policy was exported, "" if not), checkpoints (each written, oldest first: step,
        location, bytes, sha256, pruned), placement (where each actor ran: its node and
        devices) and every emitted series as
        {name: [(step, value), ...]}, its latest SERIES_TAIL points."""
        return {
            "run_id": self.run_id,
            "state": self.state,
            "reason": self.reason,
            "error": self.error,
            "error_detail": self.error_detail,
            "steps": self.version,
            "wall_s": self.timings.get("loops", time.time() - self._loop_started if self._loop_started else 0.0),
            "timings": dict(self.timings),
            "policy_sha256": self.policy_sha256,
            "export_dir": self.export_dir,
            "checkpoints": [dataclasses.asdict(c) for c in self.checkpoints_written],
            "placement": list(self.placement),
            "series": {name: list(points) for name, points in self.series.items()},
        }

    def _spawn(self, model_dir: str) -> bool:
        """Create the run's actors and start their loops; False if cancelled meanwhile."""
        if self._stop.is_set():
            return False
        kill_named(run_actor_names(self.run_id, include_driver=False))  # a previous driver's
        placement.remove_named(placement_group_name(self.run_id))  # a previous driver's group
        cfg, b = self.cfg, self.cfg.trainer.batch_groups
        w = cfg.inference.num_workers
        self._set_phase(
            "starting_engines",
            f"starting {w} {cfg.inference.backend} inference worker{'s' if w != 1 else ''}, the trainer and the buffer",
        )
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        plan = placement.plan(cfg)
        self.placement_group = placement.create(plan, placement_group_name(self.run_id))
        if not self._wait(
            [self.placement_group.ready()],
            deadline,
            f"the cluster could not place the run's actors within {SPAWN_TIMEOUT_S:.0f}s: they ask for "
            f"{plan.summary} (inference.*, trainer.*, placement.*)",
        ):
            return False
        # Sync: batch k only from version k. Async: the buffer mode's head (by default at
        # most max_staleness batches ahead, so admission paces generation instead of
        # generating groups get() would drop).
        # The buffer beside the driver (no GPU, no CPU of its own): it lives as long as
        # the run's control does, whichever worker node is lost.
        beside_driver = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.buffer = BufferActor.options(
            name=f"{self.name}-buffer", namespace=NAMESPACE, scheduling_strategy=beside_driver
        ).remote(buffer_plan(cfg.buffer, cfg.mode, b), b)
        self.workers = [
            InferenceWorker.options(
                name=f"{self.name}-inference-{k}",
                namespace=NAMESPACE,
                **placement.actor_options(self.placement_group, plan.inference[k]),
            ).remote(cfg, model_dir, k, w, self.buffer, self.scratch_dir)
            for k in range(w)
        ]
        # A trainer pool: ranks 1.. first, so that rank 0 (the trainer actor) can form the
        # pool with them while it starts (workers/trainer_pool.py).
        self.ranks = [
            TrainerRank.options(
                name=f"{self.name}-trainer-{k}",
                namespace=NAMESPACE,
                **placement.actor_options(self.placement_group, plan.trainer[k]),
            ).remote(cfg, model_dir, k, self.trainer_threads)
            for k in range(1, cfg.trainer.num_ranks)
        ]
        self.trainer = TrainerActor.options(
            name=f"{self.name}-trainer",
            namespace=NAMESPACE,
            **placement.actor_options(self.placement_group, plan.trainer[0]),
        ).remote(
            cfg,
            model_dir,
            self.buffer,
            self.workers,
            self.trainer_threads,
            self.scratch_dir,
            self.checkpoints,
            ranks=self.ranks,
        )
        if not self._wait(
            [a.ready.remote() for a in (self.buffer, self.trainer, *self.ranks, *self.workers)],
            deadline,
            f"run actors not ready after {SPAWN_TIMEOUT_S:.0f}s, their resources reserved ({plan.summary}): "
            "they are slow to start on this cluster",
        ):
            return False
        self.placement = self._where()
        self.reporter.post_placement(self.placement)
        if self.resume_from is not None:
            self._restore()
        if not self._connect_sync():
            return False
        ray.get([self.trainer.start.remote(), *(w.start.remote() for w in self.workers)])
        self._loop_started = time.time()
        self._set_phase("first_step", "loops started: waiting for the first trained step")
        return True

    def _actors(self) -> list[tuple[str, object]]:
        """(role, handle) of each of the run's actors but the driver, in the order the run
        page lists them."""
        roles = [("trainer rank 0" if self.ranks else "trainer", self.trainer)]
        roles += [(f"trainer rank {k + 1}", r) for k, r in enumerate(self.ranks)]
        roles += [(f"inference worker {k}", w) for k, w in enumerate(self.workers)]
        return [*roles, ("buffer", self.buffer)]

    def _where(self) -> list[dict]:
        """Where each actor runs (its node and devices), the driver first."""
        actors = self._actors()
        found = ray.get([a.where.remote() for _, a in actors])
        return [{"actor": "driver", **where_am_i()}] + [
            {"actor": role, **where} for (role, _), where in zip(actors, found, strict=True)
        ]

    def _node_names(self) -> dict[str, str]:
        """Node id → how a message names it: its address and labels."""
        named = {}
        for row in self.placement:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(row.get("labels", {}).items()))
            named[row["node_id"]] = row["node_ip"] + (f", {labels}" if labels else "")
        return named

    def _lost_nodes(self, exc: Exception) -> NodeLost | None:
        """The run's nodes Ray has declared dead, as a NodeLost, or None. An actor Ray
        could not reach, or one that died with its node, may be the first sign of a node
        going: its verdict is awaited up to NODE_VERDICT_S; an actor that died alone is
        not."""
        text = str(exc)
        if not (isinstance(exc, ray.exceptions.ActorUnavailableError) or "node" in text.lower()):
            return None
        ours = {row["node_id"] for row in self.placement}
        deadline = time.monotonic() + NODE_VERDICT_S
        while True:
            dead = {n["NodeID"] for n in ray.nodes() if n["NodeID"] in ours and not n.get("Alive")}
            if dead or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        if not dead:
            return None
        names = self._node_names()
        nodes = [f"{names.get(node, 'a node')} (Ray node {node[:12]})" for node in sorted(dead)]
        actors = [row["actor"] for row in self.placement if row["node_id"] in dead]
        return NodeLost(nodes, actors)

    def _wait(self, pending: list, deadline: float, late: str) -> bool:
        """Wait for every reference in `pending`; False if the run is cancelled meanwhile,
        ChildFailed(`late`) past `deadline`, an actor's constructor error as raised."""
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            ray.get(done)  # raises an actor's constructor error
            if self._stop.is_set():
                return False
            if pending and time.monotonic() > deadline:
                raise ChildFailed(late)
        return True

    def _connect_sync(self) -> bool:
        """Connect the trainer's weight sender to every worker's receiver, all at once (a
        collective's rendezvous blocks until every rank has joined); False if cancelled."""
        endpoint = ray.get(self.trainer.sync_endpoint.remote())
        pending = [self.trainer.sync_connect.remote()] + [
            w.sync_connect.remote(endpoint, k + 1) for k, w in enumerate(self.workers)
        ]
        deadline = time.monotonic() + self.cfg.sync.timeout_s + POLL_S
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            ray.get(done)  # raises a side's connect error (e.g. a LoRA base mismatch)
            if self._stop.is_set():
                return False
            if pending and time.monotonic() > deadline:
                raise SyncTimeout(self.cfg.sync.protocol, self.cfg.sync.timeout_s)
        return True

    def _supervise(self) -> str:
        """Poll until a stop condition; returns the reason."""
        while not self._stop.wait(POLL_S):
            trainer_done = self._collect()
            reason = stop_reason(
                self.cfg.stop,
                trainer_done=trainer_done,
                elapsed_s=time.time() - self._loop_started,
                rewards=[v for _, v in list(self.series["reward/mean"])[-TARGET_WINDOW:]],
            )
            if reason:
                return reason
        return "cancelled"

    def _policy_checksum(self) -> str:
        """The final weights' checksum; "" if the trainer cannot say (the run's outcome
        does not depend on it)."""
        try:
            return ray.get(self.trainer.policy_checksum.remote(), timeout=STOP_TIMEOUT_S)
        except Exception:  # a dead or stuck trainer after its last step: any error means no checksum
            log.warning("run %s: no checksum of the final policy", self.run_id, exc_info=True)
            return ""

    def _stop_children(self) -> None:
        """Stop the trainer first, its sender open, so the step and the weights it is
        sending finish while the workers still receive (a collective's receivers closing
        under a broadcast would fail it); then the workers, worker 0 running the final
        eval pass on those weights as it stops when eval is on (workers.evaluation); then
        close the sender."""
        if self.trainer is None:
            return
        try:
            final = ray.get(self.trainer.stop.remote(keep_sender=True), timeout=STOP_TIMEOUT_S)
        except Exception:  # a dead or stuck trainer: a final pass runs on the newest weights worker 0 holds
            log.warning("run %s: no final version from the trainer", self.run_id, exc_info=True)
            final = self.version
        evaluate = bool(self.cfg.eval.every_steps) and self.reason != "cancelled"
        calls = [
            w.stop.remote(final_eval_version=final if k == 0 and evaluate else None) for k, w in enumerate(self.workers)
        ]
        ray.wait(calls, num_returns=len(calls), timeout=STOP_TIMEOUT_S + (FINAL_EVAL_TIMEOUT_S if evaluate else 0))
        ray.wait([self.trainer.close_sender.remote()], timeout=STOP_TIMEOUT_S)

    def _kill_children(self) -> None:
        """Kill the run's actors and give their placement group's resources back."""
        for a in (self.trainer, *self.ranks, *self.workers, self.buffer):
            if a is not None:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(a, no_restart=True)
        if self.placement_group is not None:
            with contextlib.suppress(Exception):  # already removed
                placement.remove(self.placement_group)
            self.placement_group = None

    # -- metrics -------------------------------------------------------------------

    def _emit(self, series: str, step: int, value: float, t: float | None = None) -> None:
        """The run's one way out for a point: to the site (the reporter refuses a series
        not in workers.metric_names.METRICS) and into the summary's series."""
        self.reporter.add(series, step, value, t)
        self.series[series].append((step, float(value)))

    def _collect(self) -> bool:
        """Drain the actors' metrics and report them; True once the trainer is done.
        Raises ChildFailed if an actor failed or died."""
        if self.trainer is None:
            return False
        try:
            tr: TrainerReport = ray.get(self.trainer.drain_metrics.remote())
            reports: list[InferenceReport] = ray.get([w.drain_metrics.remote() for w in self.workers])
            # Ranks 1.. report through rank 0; asking them is how a dead one is noticed
            # (rank 0 would wait for it inside a collective).
            ray.get([r.ready.remote() for r in self.ranks])
        except ray.exceptions.RayActorError as exc:
            lost = self._lost_nodes(exc)
            if lost:
                raise lost from exc
            # Ray's error names the dead actor and why it died (workers.failures reads it).
            raise ChildFailed("a run actor died") from exc
        if tr.error:
            raise ChildFailed("trainer failed", who="trainer", detail=tr.error)
        for k, rep in enumerate(reports):
            if rep.error:
                raise ChildFailed(f"inference worker {k} failed", who=f"inference worker {k}", detail=rep.error)

        for record in tr.checkpoints:
            self._report_checkpoint(record)
        for rec in tr.steps:
            for series, value in rec.metrics.items():
                self._emit(series, rec.step, value, rec.t1)
            self._pending_windows.append((rec.step, rec.t0, rec.t1))
            self.version = rec.step
        if tr.steps and self.phase != "stepping":
            self._set_phase("stepping")
        if tr.steps:
            # One point per collected step.
            for series, value in partial_metrics([r.partial for r in reports]).items():
                self._emit(series, self.version, value)
        for k, rep in enumerate(reports):
            for ev in rep.evals:
                for series, value in ev.metrics.items():
                    self._emit(series, ev.step, value, ev.t)
            self._windows.report(k, rep.segments, rep.open_segment, rep.now)
            for s in rep.syncs:
                self._syncs[s.version].append(s)
        self._emit_windows()
        self._emit_syncs()
        self.reporter.flush()
        return tr.done

    def _emit_windows(self) -> None:
        while self._pending_windows and self._windows.complete(self._pending_windows[0][2]):
            step, t0, t1 = self._pending_windows.pop(0)
            for series, value in self._windows.window(t0, t1).items():
                self._emit(series, step, value, t1)
            self._windows.prune(t1)

    def _emit_syncs(self) -> None:
        """One point per version once every worker has loaded it: the slowest worker's
        figures. Versions a worker skipped (a newer one arrived first) are dropped."""
        w = len(self.workers)
        complete = sorted(v for v, stats in self._syncs.items() if len(stats) == w)
        for v in complete:
            stats = self._syncs.pop(v)
            self._emit("sync/latency_ms", v, max(s.end_to_end_ms for s in stats))
            self._emit("sync/inference_ms", v, max(s.inference_ms for s in stats))
        if complete:
            for v in [v for v in self._syncs if v < complete[-1]]:
                del self._syncs[v]


def stop_reason(stop: StopConfig, *, trainer_done: bool, elapsed_s: float, rewards: list[float]) -> str | None:
    """Why the run should stop now, or None. max_steps is the trainer's own limit (it
    stops after its last step); max_minutes counts from the start of the loops, after
    the warm start and actor start-up; target_reward is judged on the mean of the last
    TARGET_WINDOW steps' reward/mean."""
    if trainer_done:
        return "max_steps"
    if elapsed_s >= stop.max_minutes * 60:
        return "max_minutes"
    recent = rewards[-TARGET_WINDOW:]
    if (
        stop.target_reward is not None
        and len(recent) == TARGET_WINDOW
        and sum(recent) / TARGET_WINDOW >= stop.target_reward
    ):
        return "target_reward"
    return None
