"""The run driver: the detached Ray actor `run-<id>` that is one run.

The platform starts and stops it through workers.run.lifecycle. The driver builds (or
finds) the warm-started policy, creates the run's actors in the run's Ray placement
group and starts their loops (`RunActors`, workers/run/spawn.py), and supervises them:
every POLL_S it drains their metrics, reports them through the `MetricsReporter`
(`RunMetrics`: one point per series per trainer step, step = policy version) and checks
the stop conditions.

Status goes to the platform as running → succeeded | failed (with the failure's record:
a sentence saying why, its facts and the traceback, workers.run.failures). A
cancelled run posts no terminal status: the platform set "cancelled" itself. While
running, each change of phase goes with the status (workers.run.reporter.PHASES): warm_start
(with the supervised steps done when it builds the policy), starting_engines,
first_step, stepping; start-up can take a minute before the first point.

Checkpoints (workers/run/checkpoints.py, `checkpoint` in the config): the trainer writes one
every `every_steps` steps, the driver has it write one more when the run stops as
planned, and each is announced to the site; a driver given `resume_from` restores one
into its new actors before their loops start and continues from its step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import defaultdict, deque
from functools import partial

import ray

from workers.config.run_config import RunConfig, StopConfig
from workers.core.logs import configure_driver_logging
from workers.core.metric_names import REWARD_WINDOW
from workers.core.run_actors import actor_class, actor_name
from workers.core.timeline import StepWindows
from workers.rl_tasks import make_task
from workers.rollout.episode_timing import EpisodeTiming, timing_metrics
from workers.rollout.episodes import is_multi_agent
from workers.rollout.partial_rollouts import partial_metrics
from workers.rollout.reward_stage import RewardReport, pool_metrics
from workers.run.admission import engine_errors
from workers.run.checkpoints import Checkpoint, CheckpointRecord, CheckpointTarget, check_resume, check_resume_split
from workers.run.failures import ChildFailed, Failure, explain, node_label
from workers.run.messages import InferenceReport, StepRecord, TrainerReport
from workers.run.paths import Confinement, make_scratch, remove_scratch
from workers.run.reporter import MetricsReporter
from workers.run.runnable import check_runnable
from workers.run.schedule import Schedule, replay_problem, schedule_problem
from workers.run.spawn import RunActors
from workers.run.watchdog import Watchdog, unanswered
from workers.train.policy_cache import cached_policy

log = logging.getLogger(__name__)

# Metrics poll period: shorter → fresher charts, more actor calls (≈1 ms each).
POLL_S = 0.5
# target_reward is judged on the mean reward/mean of this many latest steps.
TARGET_WINDOW = REWARD_WINDOW
# The driver keeps this many latest points of each series for its summary (the site
# stores them all): more → a longer summary, a driver that grows with a fast run.
SERIES_TAIL = 2_000
# At the end the driver retries the site this long for the last points and the final
# status before it exits (what is left stays in the spool): longer keeps a finished run
# from looking lost to the platform's reconcile while the site restarts.
FINAL_FLUSH_S = 30.0
CANCEL_FLUSH_S = 2.0
# Warm-start progress is posted at most this often: each post is an HTTP round trip.
PHASE_PROGRESS_S = 1.0


@actor_class(num_cpus=0, max_concurrency=8)
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
        replay: dict | None = None,
    ) -> None:
        """`config` is validated here, once; the actors get the validated sections.
        `confinement`: where the run may read and write (workers/run/paths.py); without one,
        no config path is allowed and the scratch goes under `cache_dir`. `resume_from`:
        a checkpoint (a step directory under `confinement.checkpoint_root`, of this run
        or another) to continue from (workers/run/checkpoints.py). `replay`: the schedule
        another run of this config recorded (its summary's `schedule`), which this run
        follows (workers/run/schedule.py); a resumed run's record is replayed resuming
        from the checkpoint it resumed from."""
        self.confinement = confinement or Confinement(
            scratch_root=os.path.join(cache_dir, "scratch"), export_root=os.path.join(cache_dir, "exports")
        )
        configure_driver_logging(run_id, log_file=self.confinement.log_file(run_id))
        self.run_id = run_id
        self.name = actor_name(run_id)
        self.cfg = check_runnable(RunConfig.model_validate(config))
        self.cache_dir = cache_dir
        self.scratch_dir = self.confinement.scratch_dir(run_id)
        self.resume_from = resume_from
        self.checkpoints = self._checkpoint_target()
        self.exit_when_done = exit_when_done
        self.trainer_threads = trainer_threads
        self.reporter = MetricsReporter(run_id, ingest_url, token, cache_dir)
        self.state = "created"  # created → starting → running → succeeded | failed | cancelled
        self.reason = ""
        self.failure: Failure | None = None  # why it failed (workers.run.failures)
        self.error = ""  # its sentence, for people
        self.error_detail = ""  # its facts (no traceback: that is the record's, for admins)
        self.version = 0
        self.metrics = RunMetrics(self.reporter, self.cfg.inference.num_workers)
        self.watchdog = Watchdog(self.cfg.watchdog)
        self._stop = threading.Event()
        self.replay = replay
        self.actors = RunActors(
            run_id, self.cfg, self.scratch_dir, self.checkpoints, trainer_threads, self._stop, replay=replay
        )
        self._loop_started = 0.0
        self.timings: dict[str, float] = {}  # seconds per phase: warm_start, spawn, loops
        self.policy_sha256 = ""  # of the trainer's final weights, once the loops have stopped
        self.ledger: dict[str, float] = {}  # the prompt ledger's totals, once the loops have stopped
        self.schedule: dict = {}  # the schedule the buffer recorded, once the loops have stopped
        self.export_dir = ""  # where the final policy was exported (workers/train/export.py)
        self.checkpoints_written: list[CheckpointRecord] = []
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
        log.info("run %s: driver started (pid %s)", self.run_id, os.getpid())
        self._set_phase("warm_start", "loading the warm-started policy")
        try:
            # Again here, not only at launch: a symlink may have changed since.
            self.confinement.check(self.cfg)
            refused = engine_errors(self.cfg)  # the platform refuses these at launch; a direct launch is not
            if refused:
                raise ValueError("; ".join(refused.values()))
            if self.resume_from is not None:
                self.resume_from = check_resume(self.resume_from, self.confinement.checkpoint_root)
                check_resume_split(self.resume_from, self.cfg)
            if self.replay is not None:
                self._check_replay()
            make_scratch(self.scratch_dir)
            t0 = time.perf_counter()

            model_dir = cached_policy(self.cfg, self.cache_dir) or self._build_policy()
            self.timings["warm_start"] = time.perf_counter() - t0
            if self._spawn(model_dir):
                self.timings["spawn"] = time.perf_counter() - t0 - self.timings["warm_start"]
                self.state = "running"
                self.reason = self._supervise()
                self.timings["loops"] = time.time() - self._loop_started
                t1 = time.perf_counter()
                self.actors.stop(self.version, evaluate=bool(self.cfg.eval.every_steps) and self.reason != "cancelled")
                self._collect()
                self.policy_sha256 = self.actors.policy_checksum()
                self._report_ledger()
                self._report_schedule()
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
                # The last points (the ledger's among them) before the status that ends the
                # run, so that what the site does at the end finds them stored.
                self.reporter.flush()
                self.reporter.post_status("succeeded")
        except Exception as exc:
            self.state, self.reason = "failed", "error"
            failure = explain(exc, self.cfg, phase=self.phase, nodes=self.actors.node_names())
            self.failure = failure
            self.error, self.error_detail = failure.message, failure.detail
            log.error("run %s failed: %s\n%s\n%s", self.run_id, self.error, self.error_detail, failure.traceback)
            self.reporter.post_status("failed", failure=failure)
        finally:
            self._kill_children()
            remove_scratch(self.scratch_dir)
            # A cancel waits on this: the points it cannot send now stay in the spool.
            self.reporter.close(timeout_s=CANCEL_FLUSH_S if self.reason == "cancelled" else FINAL_FLUSH_S)
            log.info(
                "run %s: driver done: %s (%s) at policy version %s", self.run_id, self.state, self.reason, self.version
            )
        return self.summary()

    def _export(self) -> None:
        """The final policy as a Hugging Face directory in the run's export directory
        (workers/train/export.py): written by the trainer, which holds the weights. A run whose
        model cannot be exported has not delivered what it was for, so it fails."""
        target = self.confinement.export_dir(self.run_id)
        if target is None:
            return
        t0 = time.perf_counter()
        self.actors.export(target)
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

    def _report_ledger(self) -> None:
        """The prompt ledger's totals once the loops have stopped (workers/run/ledger.py),
        as the `ledger/*` series' one point, at the run's last step."""
        self.ledger = self.actors.ledger()
        for series, value in self.ledger.items():
            self.metrics.emit(series, self.version, value)
        if self.ledger.get("ledger/unaccounted"):
            log.warning("run %s: the prompt ledger does not close: %s", self.run_id, self.ledger)

    def _report_schedule(self) -> None:
        """The recorded schedule once the loops have stopped (the summary's `schedule`),
        its size as the `schedule/*` series' one point, at the run's last step, and the
        schedule itself to the site, which keeps it for a replay of the run. Posted before
        the final status, so a run the site shows as ended has its schedule stored."""
        self.schedule = self.actors.schedule()
        for name in ("bytes", "bytes_per_step"):
            if name in self.schedule:
                self.metrics.emit(f"schedule/{name}", self.version, float(self.schedule[name]))
        if self.schedule.get("batches"):
            self.reporter.post_schedule(self.schedule)

    def _check_replay(self) -> None:
        """A replay's schedule must be well formed and this config one a schedule covers
        (ValueError, a sentence naming what to change)."""
        assert self.replay is not None
        schedule = Schedule.from_json(self.replay)
        resume_step = Checkpoint(self.resume_from).step if self.resume_from is not None else 0
        problem = replay_problem(self.cfg, is_multi_agent(make_task(self.cfg.task)))
        problem = problem or schedule_problem(schedule, self.cfg, resume_step)
        if problem:
            raise ValueError(f"this run cannot be replayed: {problem}")

    def _final_checkpoint(self) -> None:
        """The checkpoint of a run that stopped as planned (checkpoint.at_end), written by
        the trainer once the loops have stopped; skipped if its last step has one."""
        if self.checkpoints is None or not self.cfg.checkpoint.at_end:
            return
        t0 = time.perf_counter()
        record = self.actors.checkpoint()
        if record is not None:
            self._report_checkpoint(record)
        self.timings["checkpoint"] = time.perf_counter() - t0

    def _report_checkpoint(self, record: CheckpointRecord) -> None:
        self.checkpoints_written.append(record)
        self.reporter.post_checkpoint(record.step, record.location, record.bytes, record.sha256, record.pruned)

    def _set_phase(self, phase: str, detail: str = "") -> None:
        """Tell the site what the run is doing now (with the status, which stays running)."""
        if phase != self.phase:
            log.info("run %s: phase %s %s", self.run_id, phase, detail)
        self.phase = phase
        self._phase_posted_at = time.monotonic()
        self.reporter.post_status("running", phase=phase, detail=detail)

    def _build_policy(self) -> str:
        """Build the warm-started policy (the first run of its config on this machine)."""
        # Here, not at the module's head: the build trains, so it imports torch and the
        # trainer, which a driver whose policy is cached never needs (workers/run/inference_worker.py
        # says what torch costs a driver).
        from workers.train.warmstart import policy_dir

        return policy_dir(self.cfg, self.cache_dir, self._warm_start_progress)

    def _warm_start_progress(self, done: int, total: int) -> None:
        if done == total or time.monotonic() - self._phase_posted_at >= PHASE_PROGRESS_S:
            self._set_phase("warm_start", f"building the warm-started policy: step {done}/{total}")

    def summary(self) -> dict:
        """state, reason, error (a sentence), error_detail (its facts), failure (the
        record, traceback included: workers.run.failures.Failure.fields; None), steps,
        wall_s (of the loops), timings (seconds per phase), policy_sha256 (the final
        weights' checksum: equal for bit-identical policies), export_dir (where the final
        policy was exported, "" if not), checkpoints (each written, oldest first: step,
        location, bytes, sha256, pruned), placement (where each actor ran: its node and
        devices), every emitted series as
        {name: [(step, value), ...]}, its latest SERIES_TAIL points, and a multi-agent
        task's episode figures over its latest SERIES_TAIL episodes together (episodes:
        the episode/* and agent/*/p50_s|p90_s values; {} for other tasks), what the
        watchdog saw end (watched: actor → operation → count, workers/run/watchdog.py),
        the prompt ledger's totals (ledger: the `ledger/*` values, workers/run/ledger.py;
        {} before the loops stopped) and the schedule the buffer recorded (schedule:
        workers/run/schedule.py's `schedule_json`, what `replay` takes; {} before)."""
        return {
            "run_id": self.run_id,
            "state": self.state,
            "reason": self.reason,
            "error": self.error,
            "error_detail": self.error_detail,
            "failure": self.failure.fields() if self.failure is not None else None,
            "steps": self.version,
            "wall_s": self.timings.get("loops", time.time() - self._loop_started if self._loop_started else 0.0),
            "timings": dict(self.timings),
            "policy_sha256": self.policy_sha256,
            "export_dir": self.export_dir,
            "checkpoints": [dataclasses.asdict(c) for c in self.checkpoints_written],
            "placement": list(self.actors.placement),
            "series": {name: list(points) for name, points in self.metrics.series.items()},
            "episodes": timing_metrics(list(self.metrics.episodes)),
            "watched": self.watchdog.counts(),
            "ledger": dict(self.ledger),
            "schedule": dict(self.schedule),
        }

    def _spawn(self, model_dir: str) -> bool:
        """Create the run's actors (workers/run/spawn.py), restore a checkpoint into them
        when resuming, connect their weight sync and start their loops; False if
        cancelled meanwhile."""
        if self._stop.is_set():
            return False
        self.actors.remove_previous()
        w = self.cfg.inference.num_workers
        self._set_phase(
            "starting_engines",
            f"starting {w} {self.cfg.inference.backend} inference worker{'s' if w != 1 else ''}, the trainer and "
            "the buffer",
        )
        if not self.actors.spawn(model_dir):
            return False
        self.reporter.post_placement(self.actors.placement)
        if self.resume_from is not None:
            self.version = self.actors.restore(self.resume_from)
        if not self.actors.connect_sync():
            return False
        self.actors.start_loops()
        self._loop_started = time.time()
        self._set_phase("first_step", "loops started: waiting for the first trained step")
        return True

    def _supervise(self) -> str:
        """Poll until a stop condition; returns the reason."""
        while not self._stop.wait(POLL_S):
            trainer_done = self._collect()
            reason = stop_reason(
                self.cfg.stop,
                trainer_done=trainer_done,
                elapsed_s=time.time() - self._loop_started,
                rewards=self.metrics.recent("reward/mean", TARGET_WINDOW),
            )
            if reason:
                return reason
        return "cancelled"

    def _kill_children(self) -> None:
        self.actors.kill()

    # -- metrics -------------------------------------------------------------------

    def _collect(self) -> bool:
        """Drain the actors' metrics and report them; True once the trainer is done.
        Raises ChildFailed if an actor failed or died."""
        actors = self.actors
        if actors.trainer is None:
            return False
        roles = actors.roles()
        try:
            # An actor that cannot answer within the watchdog's floor is itself stuck.
            answer_s = self.cfg.watchdog.floor_s if self.cfg.watchdog.enabled else None
            asked = [r.drain_metrics.remote() for r in (actors.trainer, *actors.workers, *actors.reward_workers)]
            # Ranks 1.. report through rank 0; asking them is how a dead one is noticed
            # (rank 0 would wait for it inside a collective).
            pinged = [r.ready.remote() for r in actors.ranks]
            ready, _ = ray.wait(asked + pinged, num_returns=len(asked) + len(pinged), timeout=answer_s)
            if len(ready) < len(asked) + len(pinged):
                raise self._unanswered(asked + pinged, set(ready))
            tr: TrainerReport = ray.get(asked[0])
            reports: list[InferenceReport] = ray.get(asked[1 : 1 + len(actors.workers)])
            scoring: list[RewardReport] = ray.get(asked[1 + len(actors.workers) :])
            ray.get(pinged)
        except ray.exceptions.RayActorError as exc:
            lost = actors.lost_nodes(exc)
            if lost:
                raise lost from exc
            # Ray's record of the death names the actor and why (workers.run.ray_deaths).
            raise
        # An actor's loop failed: its record, made where it was caught.
        for failure in (tr.error, *(rep.error for rep in reports)):
            if failure is not None:
                raise ChildFailed(failure.message, failure)
        if self.cfg.watchdog.enabled:
            self._watch(roles[0][0], tr, reports, scoring)

        for record in tr.checkpoints:
            self._report_checkpoint(record)
        self.metrics.add_steps(tr.steps)
        for record in tr.steps:  # a line per step in the run's log (workers/core/logs.py)
            m = record.metrics
            log.info(
                "run %s: step %d: reward/mean %.4g, loss %.4g, %.2f s",
                self.run_id,
                record.step,
                m.get("reward/mean", float("nan")),
                m.get("loss", float("nan")),
                record.t1 - record.t0,
            )
        if tr.steps:
            self.version = tr.steps[-1].step
            if self.phase != "stepping":
                self._set_phase("stepping")
        self.metrics.add_inference(reports, self.version, new_steps=bool(tr.steps))
        self.metrics.add_rewards(scoring, self.version, new_steps=bool(tr.steps))
        self.reporter.flush()
        return tr.done

    def _watch(
        self, trainer: str, tr: TrainerReport, reports: list[InferenceReport], scoring: list[RewardReport]
    ) -> None:
        """Hand the actors' watched operations to the watchdog; a hang fails the run."""
        self.watchdog.observe(trainer, tr.watch)
        for k, rep in enumerate(reports):
            self.watchdog.observe(f"inference worker {k}", rep.watch)
        for k, rew in enumerate(scoring):
            self.watchdog.observe(f"reward worker {k}", rew.watch)
        hang = self.watchdog.check()
        if hang is not None:
            failure = hang.failure(self._node_of(hang.actor))
            raise ChildFailed(failure.message, failure)

    def _unanswered(self, refs: list, ready: set) -> ChildFailed:
        """The run's failure when actors did not answer the poll within watchdog.floor_s:
        `refs` are the poll's calls, in `_collect`'s order (trainer, inference workers,
        reward workers, trainer ranks 1..)."""
        a = self.actors
        order = [a.roles()[0][0]] + [f"inference worker {k}" for k in range(len(a.workers))]
        order += [f"reward worker {k}" for k in range(len(a.reward_workers))]
        order += [f"trainer rank {k + 1}" for k in range(len(a.ranks))]
        silent = {role: self._node_of(role) for ref, role in zip(refs, order, strict=True) if ref not in ready}
        failure = unanswered(silent, self.cfg.watchdog.floor_s)
        return ChildFailed(failure.message, failure)

    def _node_of(self, role: str) -> str:
        """How a failure names the node `role` runs on ("" if unknown)."""
        row = next((r for r in self.actors.placement if r.get("actor") == role), None)
        return node_label(row) if row is not None else ""


class RunMetrics:
    """The points a driver makes of its actors' reports: each goes to the site through
    the reporter, and the latest SERIES_TAIL of each series stay for the run's summary.

    A trainer step's metrics are points at its step (= policy version); the inference
    workers' busy/idle figures over a step's window once every one has reported past its
    end (workers.core.timeline); a version's sync figures once every inference worker has
    loaded it; the partial-rollout counts once per collection that brought steps."""

    def __init__(self, reporter: MetricsReporter, num_workers: int) -> None:
        self.reporter = reporter
        self.num_workers = num_workers
        self.series: defaultdict[str, deque[tuple[int, float]]] = defaultdict(partial(deque, maxlen=SERIES_TAIL))
        self._windows = StepWindows(num_workers)
        self._pending_windows: list[tuple[int, float, float]] = []  # (step, t0, t1)
        # version → SyncReport per inference worker that has loaded it
        self._syncs: dict[int, list] = defaultdict(list)
        self._scoring: list[RewardReport] = []  # the reward pool's reports since its last point
        self._episodes: list[EpisodeTiming] = []  # episodes ended since the last point
        self.episodes: deque[EpisodeTiming] = deque(maxlen=SERIES_TAIL)  # the latest, for the summary

    def emit(self, series: str, step: int, value: float, t: float | None = None) -> None:
        """The run's one way out for a point: to the site (the reporter refuses a series
        not in workers.core.metric_names.METRICS) and into the summary's series."""
        self.reporter.add(series, step, value, t)
        self.series[series].append((step, float(value)))

    def recent(self, series: str, n: int) -> list[float]:
        """The latest `n` values of `series`."""
        return [v for _, v in list(self.series[series])[-n:]]

    def add_steps(self, steps: list[StepRecord]) -> None:
        for rec in steps:
            for series, value in rec.metrics.items():
                self.emit(series, rec.step, value, rec.t1)
            self._pending_windows.append((rec.step, rec.t0, rec.t1))

    def add_inference(self, reports: list[InferenceReport], version: int, new_steps: bool) -> None:
        """The inference workers' reports of one collection; `new_steps`: it brought
        trainer steps, the newest at `version`."""
        ended = [t for r in reports for t in r.episodes]
        self._episodes += ended
        self.episodes.extend(ended)
        if new_steps:
            for series, value in partial_metrics([r.partial for r in reports]).items():
                self.emit(series, version, value)
            for series, value in timing_metrics(self._episodes).items():
                self.emit(series, version, value)
            self._episodes = []
        for k, rep in enumerate(reports):
            for ev in rep.evals:
                for series, value in ev.metrics.items():
                    self.emit(series, ev.step, value, ev.t)
            self._windows.report(k, rep.segments, rep.open_segment, rep.now)
            for s in rep.syncs:
                self._syncs[s.version].append(s)
        self._emit_windows()
        self._emit_syncs()

    def add_rewards(self, reports: list[RewardReport], version: int, new_steps: bool) -> None:
        """The reward workers' reports of one collection: one point of the pool's busy
        fraction and scoring lag per collection that brought trainer steps."""
        self._scoring += reports
        if new_steps and self._scoring:
            for series, value in pool_metrics(self._scoring).items():
                self.emit(series, version, value)
            self._scoring = []

    def _emit_windows(self) -> None:
        while self._pending_windows and self._windows.complete(self._pending_windows[0][2]):
            step, t0, t1 = self._pending_windows.pop(0)
            for series, value in self._windows.window(t0, t1).items():
                self.emit(series, step, value, t1)
            self._windows.prune(t1)

    def _emit_syncs(self) -> None:
        """One point per version once every inference worker has loaded it: the slowest
        one's figures. Versions one skipped (a newer one arrived first) are dropped."""
        complete = sorted(v for v, stats in self._syncs.items() if len(stats) == self.num_workers)
        for v in complete:
            stats = self._syncs.pop(v)
            self.emit("sync/latency_ms", v, max(s.end_to_end_ms for s in stats))
            self.emit("sync/inference_ms", v, max(s.inference_ms for s in stats))
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
