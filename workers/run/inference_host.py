"""What an inference worker of a run does, in its actor's process: generates groups with the
weights it holds and puts them into the run's buffer (workers/run/actors.py has the
picture of a run's actors). The Ray actor class is `InferenceWorker`
(workers/run/inference_worker.py), which builds an `InferenceHost` in its constructor.
This module imports what generation needs (torch, the backend, the sync protocol's
receiving end) and nothing of the trainer's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import threading
import time
from typing import TYPE_CHECKING, cast

import ray
import torch

from workers.config.run_config import RunConfig
from workers.core.records import Group, call_seed
from workers.core.run_actors import where_am_i
from workers.core.timeline import GENERATE, HANDOFF, SCORE_WAIT, Timeline
from workers.core.watch import GENERATE as WATCHED_GENERATE
from workers.core.watch import WEIGHT_LOAD, Watch
from workers.inference.backends import make_backend
from workers.model.loading import model_config, model_dims
from workers.model.tokenizer import load_tokenizer
from workers.rl_tasks import make_task
from workers.rollout.context import context_tokens
from workers.rollout.episode_scheduler import EpisodeScheduler, LateOvercommit
from workers.rollout.episodes import is_multi_agent
from workers.rollout.evaluation import eval_prompts, evaluate, is_due, training_prompts
from workers.rollout.generation import generate
from workers.rollout.partial_rollouts import (
    PartialCounts,
    StagedWeights,
    UpdatePolicy,
    WeightsMidGeneration,
    WeightUpdates,
    weights_mid_generation_forced,
)
from workers.rollout.reward_stage import RewardPool
from workers.rollout.task_data import DatasetPrompts, worker_prompts
from workers.run.actors import WAIT_S, raise_start_failure, record_failure, started
from workers.run.buffer import groups_per_call
from workers.run.failures import LOOP, Failure
from workers.run.ledger import InFlight, Row
from workers.run.messages import EvalRecord, InferenceReport
from workers.run.schedule import RecordedUpdates, ReplayedUpdates
from workers.sync import driven_engine, make_receiver

if TYPE_CHECKING:
    from workers.core.sync_messages import Notice, SyncReport
    from workers.inference.vllm_backend import VLLMBackend

log = logging.getLogger(__name__)

# An inference worker refused admission sleeps this long unless new weights wake it first.
ADMIT_POLL_S = 0.05
# At the end of a run with eval on, inference worker 0 waits this long for the trainer's
# last weights before the final eval pass (else the pass runs on the newest it holds).
FINAL_WEIGHTS_WAIT_S = 30.0


class InferenceHost:
    """Generates groups with the weights it holds and puts them into the buffer.

    New weights are fetched as soon as they are published (overlapping generation) and
    loaded as `sync.update_mode` says: between two generate calls (drain: a call in
    flight finishes on the old weights), or between two decode steps of a call (abort and
    in-flight modes, workers/rollout/partial_rollouts.py). Only the newest staged version is loaded."""

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: str,
        index: int,
        num_workers: int,
        buffer,
        scratch_dir: str | None = None,
        reward_workers: list | None = None,
        num_threads: int | None = None,
    ) -> None:
        """`scratch_dir`: the run's scratch directory; this worker's files go under
        `inference-<index>/` in it. `reward_workers`: the run's reward pool
        (workers/rollout/reward_stage.py); none: this worker scores its own groups.
        `num_threads`: torch's threads here (workers/run/placement.py, `phase_threads`);
        None keeps Ray's (the CPUs the worker reserved, at least 1)."""
        self.error: Failure | None = None
        if num_threads is not None:  # before the backend: vLLM-CPU computes with torch's count
            torch.set_num_threads(num_threads)
        self.start_failure = started(
            lambda: self._start(cfg, model_dir, index, num_workers, buffer, scratch_dir, reward_workers),
            cfg,
            f"inference worker {index}",
        )

    def _start(
        self,
        cfg: RunConfig,
        model_dir: str,
        index: int,
        num_workers: int,
        buffer,
        scratch_dir: str | None,
        reward_workers: list | None,
    ) -> None:
        self._generate = generate
        # The update mode, read here once: generation and the loops ask this policy.
        self.policy = UpdatePolicy.of(cfg)
        self.partial = PartialCounts()  # cumulative, for rollout/partial_*
        self.cfg = cfg
        self.index = index
        self.buffer = buffer
        own_scratch = os.path.join(scratch_dir, f"inference-{index}") if scratch_dir else None
        self.tokenizer = load_tokenizer(model_dir)
        # A vLLM engine sizes its KV cache for the longest sequence the run holds, not for
        # the model's whole context (workers/rollout/context.py).
        max_model_len = None
        if cfg.inference.backend == "vllm":
            max_model_len = context_tokens(cfg, self.tokenizer, model_dims(model_config(model_dir)).positions)
        self.backend = make_backend(
            self.cfg,
            model_dir,
            own_scratch,
            exact_steps=self.policy.exact_steps,
            max_model_len=max_model_len,
        )
        self.task = make_task(self.cfg.task)
        # A dataset's share, or the task's generator less the held-out eval prompts.
        self.prompts = training_prompts(cfg, self.task, worker_prompts(cfg, self.task, index, num_workers))
        # Worker 0 runs the eval passes (workers/rollout/evaluation.py); None: this one does not.
        self.eval_prompts = eval_prompts(cfg, self.task) if cfg.eval.every_steps and index == 0 else None
        self.evaluated = 0  # the version of the last eval pass
        self.evals: list[EvalRecord] = []
        self._evals_lock = threading.Lock()
        self.chunk_groups = groups_per_call(self.cfg.trainer.batch_groups, num_workers)
        self.rng = random.Random(f"{self.cfg.seed}-prompts-{index}")
        self.version = 0  # policy version of the weights in the backend
        self.calls = 0
        # The prompt ledger's part here (workers/run/ledger.py): rows drawn fresh, rows
        # drawn and not yet in the buffer, and a resumed checkpoint's rows still to start.
        self.drawn = 0
        self.in_flight = InFlight()
        self._carried: list[Row] = []
        # A draw and a checkpoint's read of this state exclude each other: a row is drawn
        # and in flight in the same snapshot, or in neither.
        self._draw_lock = threading.Lock()
        self.timeline = Timeline()
        self.watch = Watch()  # its generate calls and weight loads, for the driver's watchdog
        self.rewards = None
        if reward_workers:
            self.rewards = RewardPool(reward_workers, cfg.rewards, offset=index)
            self.rewards.on_wait = self._wait_for_scores
        self.num_workers = num_workers
        # Episodes in flight on their own clocks (workers/rollout/episode_scheduler.py): a multi-agent
        # task's always, a multi-turn task's under buffer.unit 'episode'.
        self.episodes = None
        self.timings: list = []  # their EpisodeTimings since the last drain

        if is_multi_agent(self.task) or cfg.buffer.unit == "episode":
            env_rng = random.Random(f"{self.cfg.seed}-environment-{index}")
            self.episodes = EpisodeScheduler(self.backend, self.task, self.tokenizer, self.cfg, env_rng)
        # A test of the late groups holds the overcommitted ones until their batch is taken
        # (workers/rollout/episode_scheduler.py, OVERCOMMIT_ENDS_LATE_ENV).
        self._late_overcommit = LateOvercommit.forced(cfg, self.chunk_groups)
        self.receiver = make_receiver(
            cfg.sync,
            model_dir=model_dir,
            scratch_dir=os.path.join(own_scratch, "adapters") if own_scratch else None,
            engine=driven_engine(cfg),
            backend=self.backend,
        )
        self.syncs: list[SyncReport] = []
        self._syncs_lock = threading.Lock()
        self.staged = StagedWeights(self._load, lambda: self.version)
        # Tests of the stepped update modes force weights to arrive mid-generation
        # (workers/rollout/partial_rollouts.py, WEIGHTS_MID_GENERATION_ENV).
        self._force_mid_generation = weights_mid_generation_forced() and self.policy.exact_steps
        self._groups_put = 0  # groups this worker handed to the buffer (the forced wait's rule)
        # In a replay under a stepped update mode, this worker's recorded loads inside its
        # calls ({call: [(step, version)]}, workers/run/schedule.py), asked of the buffer
        # before the first call; None when the run is no replay.
        self._replay_loads: dict[int, list[tuple[int, int]]] | None = None
        self._replay_loads_asked = False
        self._resume_at = 0  # resumed: generate nothing before this version's weights arrive
        self._weights_arrived = threading.Event()
        # Colocated, taking turns: set while vLLM sleeps, so the trainer rank sharing
        # this GPU may step (`wait_asleep`); cleared before it wakes.
        self._gpu_handed_over = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ready(self) -> bool:
        return raise_start_failure(self.start_failure)

    def where(self) -> dict:
        return where_am_i()

    def sync_connect(self, endpoint: dict, rank: int) -> None:
        """Join the trainer's sender (blocks until every rank joins, for a collective)."""
        self.receiver.connect(endpoint, rank)

    def state_dict(self) -> dict:
        """What decides this worker's next prompts and seeds, as JSON data (a checkpoint's
        inference.json holds one per worker), and its part of the prompt ledger; safe
        while the loop runs (a draw is whole or not begun)."""
        with self._draw_lock:
            return self._state()

    def _state(self) -> dict:
        state = {
            "index": self.index,
            "rng": list(self.rng.getstate()),
            "calls": self.calls,
            "version": self.version,
            "evaluated": self.evaluated,
            "partial": self.partial.state_dict(),
            "drawn": self.drawn,
            "in_flight": self.in_flight.state(),
            "carried": [list(row) for row in self._carried],
        }
        if isinstance(self.prompts, DatasetPrompts):  # a task's generator has no state of its own
            state["dataset"] = self.prompts.state_dict()
        return state

    def load_state_dict(self, state: dict, carried: list[Row] | None = None) -> None:
        """`carried`: the rows to generate before drawing new ones (`workers.run.ledger
        .carried`: the state's rows not begun or in flight, less those the buffer has)."""
        version, internal, gauss = state["rng"]  # JSON made the state's tuples lists
        self.rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
        self.calls = int(state["calls"])
        self.version = int(state["version"])
        self.evaluated = int(state["evaluated"])
        self.partial.load_state_dict(state["partial"])
        if isinstance(self.prompts, DatasetPrompts) and "dataset" in state:
            self.prompts.load_state_dict(state["dataset"])
        self.drawn = int(state.get("drawn", 0))  # a checkpoint from before the ledger has none
        self._carried = list(carried or [])

    def restore(self, state: dict | None, policy_version: int, carried: list[Row] | None = None) -> None:
        """Take a checkpoint's state (None: the checkpoint has none for this worker)
        and the rows it carries (`load_state_dict`) before the loop starts. The backend
        still holds the run's initial weights: the loop generates nothing until the
        trainer has sent `policy_version`, the checkpoint's policy."""
        if state is not None:
            self.load_state_dict(state, carried)
        self._resume_at = policy_version

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"inference-{self.index}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0, final_eval_version: int | None = None) -> None:
        """Finish the call in flight, then stop and close the backend. With
        `final_eval_version` (worker 0, eval on), first run the run's final eval pass on
        that version's weights, unless a pass already ran on them."""
        self._stop.set()
        self._weights_arrived.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # still inside generate: closing now would pull the engine from under it
        try:
            if self.receiver.blocks_sender:
                # A trainer stopped in the middle of a send waits for this worker to join it.
                self.staged.apply()
            if final_eval_version is not None and self.eval_prompts is not None:
                self._final_eval(final_eval_version, self.eval_prompts)
        except Exception as exc:
            self.error = record_failure(exc, self.cfg, f"inference worker {self.index}", "final eval")
        finally:
            self.backend.close()
            self.receiver.close()

    def wait_asleep(self, timeout: float) -> bool:
        """True once this worker's vLLM sleeps and the trainer rank sharing its GPU may
        step (colocated, taking turns: workers/run/colocation.py); False after `timeout`,
        for the caller to ask again. True at once for a worker that never sleeps."""
        if self._sleeper() is None:
            return True
        return self._gpu_handed_over.wait(timeout)

    def update_weights(self, notice: Notice) -> None:
        """Receive new weights now (overlapping generation); the loop applies them
        before its next generate call."""
        self.staged.stage(self.receiver.receive(notice), notice.version)
        self._weights_arrived.set()

    def drain_metrics(self) -> InferenceReport:
        """What happened since the last drain: time segments, syncs, errors."""
        closed, open_seg, now = self.timeline.drain()
        with self._syncs_lock:
            syncs, self.syncs = self.syncs, []
        with self._evals_lock:
            evals, self.evals = self.evals, []
            timings, self.timings = self.timings, []
        # A copy: the loop thread keeps adding to self.partial while Ray pickles the report.
        return InferenceReport(
            segments=closed,
            open_segment=open_seg,
            now=now,
            syncs=syncs,
            version=self.version,
            error=self.error,
            partial=dataclasses.replace(self.partial),
            evals=evals,
            episodes=timings,
            watch=self.watch.drain(),
        )

    # -- the loop ------------------------------------------------------------------

    def _sleeper(self) -> VLLMBackend | None:
        """The backend when it takes turns with a colocated trainer rank (inference.sleep_level
        1 or 2, which admission allows on vLLM only), else None."""
        return cast("VLLMBackend", self.backend) if self.cfg.inference.sleep_level else None

    def _hand_over_gpu(self) -> None:
        """Colocated, taking turns: vLLM sleeps, then the trainer rank may step (a no-op
        for a worker that never sleeps)."""
        if sleeper := self._sleeper():
            sleeper.sleep()
            self.timeline.fall_asleep()
            self._gpu_handed_over.set()

    def _awake(self) -> None:
        """vLLM wholly awake before it generates (a no-op when it is, or never sleeps)."""
        if sleeper := self._sleeper():
            self._gpu_handed_over.clear()
            self.timeline.wake()
            sleeper.wake_up(("weights", "kv_cache"))

    def _load(self, staged) -> None:
        """Put staged weights into the backend (`self.staged` calls it)."""
        sleeper = self._sleeper()
        if sleeper:  # the weights' memory back first: the KV cache waits for the update
            self._gpu_handed_over.clear()
            self.timeline.wake()
            sleeper.wake_up(("weights",))
        try:
            with self.watch.op(WEIGHT_LOAD):
                report = self.receiver.apply(self.backend, staged)
        finally:
            if sleeper:
                sleeper.wake_up(("kv_cache",))
        if report is None:  # a collective receiver had already applied a newer one
            return
        self.version = report.version
        self.backend.label_weights(report.version)
        with self._syncs_lock:
            self.syncs.append(report)

    def _loop(self) -> None:
        if self.episodes is not None:
            self._episode_loop()
            return
        # Weights load between two calls; forced mid-generation, not right after a call:
        # the next call waits for them after its first decode step.
        take_weights = True
        try:
            while not self._stop.is_set():
                self._weights_arrived.clear()
                if take_weights:
                    self.staged.apply()
                take_weights = True
                if not self._resumed_and_evaluated():
                    continue
                self.timeline.begin(HANDOFF)
                n = ray.get(self.buffer.admit.remote(self.version, self.chunk_groups, self.index))
                if n == 0:  # too far ahead of the trainer: wait for newer weights
                    # A refused admission is waiting, not handing off: only the one that starts a call counts.
                    self.timeline.cancel()
                    self._hand_over_gpu()  # colocated, taking turns: the trainer rank steps on this GPU now
                    self._weights_arrived.wait(ADMIT_POLL_S)
                    continue
                self.timeline.end()
                self._generate_and_put(n)
                take_weights = not self._force_mid_generation
        except Exception as exc:
            self.error = record_failure(exc, self.cfg, f"inference worker {self.index}", LOOP)

    def _resumed_and_evaluated(self) -> bool:
        """Both loops' first check: False (after a short wait) while a resumed run's
        weights have not arrived; else run the eval pass if one is due, and True."""
        if self.version < self._resume_at:
            self._weights_arrived.wait(ADMIT_POLL_S)
            return False
        if self.eval_prompts is not None and is_due(self.version, self.evaluated, self.cfg.eval.every_steps):
            self._evaluate(self.eval_prompts)
        return True

    def _episode_loop(self) -> None:
        """The loop for episodes on their own clocks (the scheduler). Groups reach the
        buffer as `buffer.unit` says: each as it ends ('episode', keeping this worker's
        share of the batch, and of `buffer.overcommit`, in flight), or a call's groups
        once all have ended ('group', the batch barrier). Weights load between turns,
        except under drain: there only with no episode in flight, and no new episode
        starts while weights wait."""
        sched = self.episodes
        assert sched is not None
        barrier = self.cfg.buffer.unit == "group"
        target = self.chunk_groups + math.ceil(self.cfg.buffer.overcommit / self.num_workers)
        held: list[Group] = []
        try:
            while not self._stop.is_set():
                self._weights_arrived.clear()
                if self.policy.loads_between_calls(bool(sched.in_flight)):
                    self.staged.apply()
                # Episodes in flight wait while a due eval pass runs (their times include
                # it): under buffer.unit 'episode' some always are.
                if not self._resumed_and_evaluated():
                    continue
                # Held groups whose batch was taken go first, even on a pass that starts no call.
                if self._late_overcommit is not None:
                    self._put(self._late_overcommit.release([], self.version))
                room = (0 if sched.in_flight else self.chunk_groups) if barrier else target - sched.in_flight
                if room > 0 and (self.policy.admits_while_pending() or not self.staged.pending()):
                    self._admit_episodes(room)
                due = sched.next_ready_in()
                if due is None:  # nothing in flight: too far ahead of the trainer
                    self._hand_over_gpu()
                    self._weights_arrived.wait(ADMIT_POLL_S)
                    continue
                if due > 0:  # every episode waits on its environment
                    self._weights_arrived.wait(min(due, ADMIT_POLL_S))
                self._awake()  # it may have handed the GPU over while nothing was in flight
                self.timeline.begin(GENERATE)
                with self.watch.op(WATCHED_GENERATE):
                    ended = sched.step(self.version)
                if sched.tokens:
                    self.timeline.end(tokens=sched.tokens)
                else:
                    self.timeline.cancel()
                with self._evals_lock:
                    self.timings += sched.drain_timings()
                held += ended if self._late_overcommit is None else self._late_overcommit.release(ended, self.version)
                if held and not (barrier and sched.in_flight):
                    self._put(held)
                    held = []
        except Exception as exc:
            self.error = record_failure(exc, self.cfg, f"inference worker {self.index}", LOOP)

    def _admit_episodes(self, room: int) -> None:
        """Ask the gate for up to `room` groups and start their episodes."""
        self.timeline.begin(HANDOFF)
        n = ray.get(self.buffer.admit.remote(self.version, room, self.index))
        if n == 0:
            self.timeline.cancel()
            return
        requeued = []
        if self.cfg.buffer.on_stale == "requeue":
            # self.calls: the call `_draw` is about to count, as the schedule numbers it.
            requeued = ray.get(self.buffer.take_requeued.remote(n, self.index, self.calls))
        self.timeline.end()
        seed, prompts = self._draw(n, requeued)
        assert self.episodes is not None
        self.episodes.admit(prompts, seed)
        if self._late_overcommit is not None:
            self._late_overcommit.admitted(seed, n, self.version)

    def _draw(self, n: int, requeued: list[Group]) -> tuple[int, list[Row]]:
        """The next generate call's seed (its groups' ids derive from it) and its `n`
        rows: stale groups' prompts to generate again first, then a resumed checkpoint's
        carried rows, then fresh draws; all in flight until their groups reach the buffer."""
        with self._draw_lock:
            seed = call_seed(self.cfg.seed, self.index, self.calls)
            self.calls += 1
            rows = [(g.prompt, g.answer) for g in requeued]
            take = min(n - len(rows), len(self._carried))
            rows += self._carried[:take]
            del self._carried[:take]
            fresh = self.prompts.sample(n - len(rows), self.rng)
            self.drawn += len(fresh)
            rows += fresh
            self.in_flight.add(seed, rows)
            return seed, rows

    def _put(self, groups: list[Group]) -> None:
        """Hand `groups` to the buffer, waiting while it is full (unless stopping). A
        receiver whose sender waits for it (vLLM's broadcast engines) takes new weights
        between two tries: the trainer that would empty the buffer may be waiting for
        this worker, and with no call in flight any update mode allows it."""
        takes_weights = self.receiver.blocks_sender
        while groups and not self._stop.is_set():
            self.timeline.begin(HANDOFF)
            accepted, blocked_s = ray.get(self.buffer.put.remote(groups, WAIT_S))
            self.timeline.end_blocked(blocked_s)
            self.in_flight.settle([g.group_id for g in groups[:accepted]])
            groups = groups[accepted:]
            if groups and takes_weights:
                self.staged.apply()

    def _wait_for_scores(self, tokens: int) -> None:
        """Generation is done, the reward pool's scores not yet: close the generate segment."""
        self.timeline.end(tokens=tokens)
        self.timeline.begin(SCORE_WAIT)

    def _evaluate(self, prompts: list[tuple[str, str]]) -> None:
        """One eval pass on `prompts` with the weights loaded now. Its time is outside the
        timeline's generate segments: it produced no rollouts, so it counts as inference
        idle."""
        self._awake()
        metrics = evaluate(
            self.backend,
            self.task,
            self.tokenizer,
            prompts,
            self.cfg.eval,
            self.cfg.inference.max_new_tokens,
            self.cfg.seed,
        )
        self.evaluated = self.version
        with self._evals_lock:
            self.evals.append(EvalRecord(step=self.version, t=time.time(), metrics=metrics))

    def _final_eval(self, version: int, prompts: list[tuple[str, str]]) -> None:
        """The end-of-run pass, the loop stopped: load the trainer's last weights (they
        may still be on their way), then evaluate them if no pass has yet."""
        self._weights_arrived.clear()
        deadline = time.monotonic() + FINAL_WEIGHTS_WAIT_S
        self.staged.apply()
        while self.version < version and time.monotonic() < deadline:
            self._weights_arrived.wait(WAIT_S)
            self._weights_arrived.clear()
            self.staged.apply()
        if self.version > self.evaluated:
            self._evaluate(prompts)

    def _generate_and_put(self, n: int) -> None:
        # on_stale="requeue": prompts of rejected groups are generated again first.
        requeued = []
        if self.cfg.buffer.on_stale == "requeue":
            self.timeline.begin(HANDOFF)
            requeued = ray.get(self.buffer.take_requeued.remote(n, self.index, self.calls))
            self.timeline.end()
        seed, prompts = self._draw(n, requeued)
        self._awake()
        updates = self._updates()
        self.timeline.begin(GENERATE)
        with self.watch.op(WATCHED_GENERATE):
            generated = self._generate(
                self.backend,
                self.task,
                self.tokenizer,
                prompts,
                self.cfg,
                self.version,
                seed,
                self.policy,
                updates,
                self.rewards,
            )
        if isinstance(updates, ReplayedUpdates) and not self._stop.is_set():
            updates.finished()
        groups = generated.groups
        self.partial.add(generated.counts)
        # With a reward pool the generate segment closed (with its tokens) when the wait began.
        self.timeline.end(tokens=0 if self.rewards is not None else sum(g.num_tokens for g in groups))
        self._put(groups)
        self._groups_put += len(groups)

    def _updates(self) -> WeightUpdates:
        """Where a generate call takes staged weights from. Under drain, `self.staged`
        (which the call never polls). Under a stepped mode, the call's loads are
        reported to the buffer for the run's schedule (workers/run/schedule.py); in a
        replay they happen where the record has them, else as `_staged_or_forced` has it."""
        if not self.policy.stepped:
            return self.staged
        call = self.calls - 1  # `_draw` counted this call

        def report(step: int, version: int) -> None:
            ray.get(self.buffer.loaded.remote(self.index, call, step, version))

        if not self._replay_loads_asked:
            self._replay_loads = ray.get(self.buffer.replay_loads.remote(self.index))
            self._replay_loads_asked = True
        if self._replay_loads is not None:
            loads = self._replay_loads.get(call, [])
            return ReplayedUpdates(self.staged, self.staged.staged_version, loads, report, self._stop)
        return RecordedUpdates(self._staged_or_forced(), report)

    def _staged_or_forced(self) -> WeightUpdates:
        """`self.staged`, or, forced mid-generation, a wait for newer weights after the
        call's first decode step where the groups already put let the trainer publish
        them (it steps on a batch_groups batch; the run's last version has none after it)."""
        if not self._force_mid_generation:
            return self.staged
        due = (
            self._groups_put >= self.cfg.trainer.batch_groups * (self.version + 1)
            and self.version < self.cfg.stop.max_steps
        )
        return WeightsMidGeneration(self.staged, due, self._stop)
