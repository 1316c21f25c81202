"""What the trainer of a run does, in its actors' processes: rank 0 (`TrainerHost`), which
takes batches from the buffer, trains, and sends the weights to the inference workers,
and the other ranks of its pool (`RankHost`); workers/run/actors.py has the picture of a
run's actors. The Ray actor classes are `TrainerActor` and `TrainerRank`
(workers/run/trainer_actors.py), which build these in their constructors. This module
imports what training needs and nothing of generation's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import ray

from workers.config.run_config import RunConfig
from workers.core.devices import assigned_device
from workers.core.metric_names import rank_series
from workers.core.records import Group
from workers.core.run_actors import where_am_i
from workers.core.watch import TRAIN_STEP, WEIGHT_SEND, Watch
from workers.run import checkpoints
from workers.run.actors import WAIT_S, raise_start_failure, record_failure, started
from workers.run.buffer import FIRST_BATCH_HOLD_ENV, NoSignalError, first_batch_hold, with_prefetched
from workers.run.buffer import plan as buffer_plan
from workers.run.checkpoints import (
    Checkpoint,
    has_shards,
    load_shards,
    read_version,
    restore_trainer,
    restore_training_state,
    write_shards,
)
from workers.run.failures import LOOP, Failure
from workers.run.ledger import (
    CHECKPOINT_IN_FLIGHT_ENV,
    IN_FLIGHT_WAIT_LIMIT_S,
    LedgerTotals,
    carried,
    checkpoint_waits_for_rows_in_flight,
)
from workers.run.messages import StepRecord, TrainerReport
from workers.run.schedule import TRAIN_WAIT_LIMIT_S, ReplayDiverged
from workers.sync import driven_engine, make_sender
from workers.sync.base import WeightSender, state_checksum
from workers.sync.lora import LoRASender
from workers.sync.weights import drain, effective_stream, follow, streamed_checksum
from workers.train.export import export_policy, follow_export
from workers.train.trainer import Trainer
from workers.train.trainer_pool import Rendezvous, join_pool

if TYPE_CHECKING:
    from workers.core.sync_messages import Gathers, Notice
    from workers.run.checkpoints import CheckpointRecord, CheckpointTarget
    from workers.train.step_plan import RankStep
    from workers.train.trainer import RankResult

log = logging.getLogger(__name__)


# A trainer rank waits this long for the others inside one collective. Longer than any
# step's imbalance between ranks; a rank that died is caught sooner by the driver, which
# checks every actor of the run each poll.
POOL_TIMEOUT_S = 900.0


def wire_dtype(cfg: RunConfig) -> str | None:
    """The dtype "cuda_ipc" and vLLM's engines send the weights in: the inference workers'
    ("auto" is the checkpoint's, known only to them: the parameters' own then)."""
    return cfg.inference.dtype if cfg.inference.dtype != "auto" else None


class RankHost:
    """Rank r ≥ 1 of a trainer pool (workers/train/trainer_pool.py): holds its replica (ddp)
    or shard (fsdp2) of the policy and runs what rank 0, the `TrainerActor`, hands it:
    its part of each step, and its part of every collective rank 0 starts (weight-sync
    gathers, checkpoints, the final weights)."""

    def __init__(self, cfg: RunConfig, model_dir: str, rank: int, num_threads: int | None = None) -> None:
        self.cfg, self.model_dir, self.rank, self.num_threads = cfg, model_dir, rank, num_threads
        self.trainer: Trainer | None = None
        self._sender: WeightSender | None = None  # its own, where every rank sends (`send_beside`)

    def ready(self) -> bool:
        return True  # nothing to fail: the rank builds its part in `join`

    def where(self) -> dict:
        return where_am_i()

    def join(self, endpoint) -> None:
        """Join rank 0's process group and build this rank's part of the policy."""
        pool = join_pool(endpoint, self.cfg.trainer.backend, self.rank, assigned_device())
        self.trainer = Trainer(self.cfg, self.model_dir, num_threads=self.num_threads, pool=pool)

    def _joined(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"trainer rank {self.rank} has not joined the pool (join first)")
        return self.trainer

    def train_rank(self, step: RankStep) -> RankResult:
        return self._joined().train_rank(step)

    def follow_sync(self, gathers: Gathers) -> None:
        """Join the gathers of rank 0's weight sender (a sharded pool only)."""
        follow(self._joined().model, gathers)

    def send_beside(self, version: int) -> None:
        """Run this rank's own sender for `version` beside rank 0's, for a protocol
        whose every rank sends (`WeightSender.every_rank_sends`)."""
        if self._sender is None:
            self._sender = make_sender(
                self.cfg.sync, engine=driven_engine(self.cfg), wire_dtype=wire_dtype(self.cfg), rank=self.rank
            )
            self._sender.attach(self._joined().model)
            self._sender.connect()
        self._sender.send(version, lambda notice: None)  # rank 0 notifies the workers

    def follow_checksum(self) -> None:
        """Join rank 0's streamed gathers of the policy for its checksum (sharded only)."""
        drain(effective_stream(self._joined().model))

    def follow_export(self) -> None:
        """Join rank 0's streamed gathers of the policy for its export (sharded only)."""
        follow_export(self._joined().model, self.cfg)

    def checkpoint_shards(self, location: str, path: str) -> list[dict]:
        """Write this rank's part of the checkpoint rank 0 is writing at `path` (sharded
        only); the manifest entries of the files it wrote."""
        return write_shards(self._joined(), location, path)

    def restore(self, version: int, location: str | None = None) -> None:
        """Take the training state of the checkpoint rank 0 restores: read from its
        shards at `location` (a sharded checkpoint), or as rank 0 broadcasts it (None)."""
        trainer = self._joined()
        if location is not None:
            load_shards(trainer, Checkpoint(location))
        else:
            restore_training_state(trainer, None)
        trainer.version = version

    def close(self) -> None:
        if self.trainer is not None and self.trainer.pool is not None:
            self.trainer.pool.close()


class _RayPeers:
    """Ranks 1.. of the pool as rank 0's step sees them (workers.train.trainer.Peers)."""

    def __init__(self, ranks: list) -> None:
        self.ranks = ranks
        self._refs: list = []

    def start(self, steps: list[RankStep]) -> None:
        self._refs = [r.train_rank.remote(s) for r, s in zip(self.ranks, steps, strict=True)]

    def results(self) -> list[RankResult]:
        refs, self._refs = self._refs, []
        return ray.get(refs)


class TrainerHost:
    """Takes B groups per step from the buffer, trains, publishes the new weights.

    In a trainer pool this is rank 0: it plans each step and hands ranks 1.. (`ranks`,
    `TrainerRank` actors) their parts, and starts every collective the others join."""

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: str,
        buffer,
        workers: list,
        num_threads: int | None = None,
        scratch_dir: str | None = None,
        checkpoints: CheckpointTarget | None = None,
        ranks: list | None = None,
    ) -> None:
        """`scratch_dir`: the run's scratch directory (filesystem sync writes there unless
        sync.directory names a place). `checkpoints`: where and how often to write them
        (None: never). `ranks`: the pool's other ranks (trainer.num_ranks − 1 of them)."""
        self.error: Failure | None = None
        self.done = False
        self.start_failure = started(
            lambda: self._start(cfg, model_dir, buffer, workers, num_threads, scratch_dir, checkpoints, ranks),
            cfg,
            "trainer",
        )

    def _start(
        self,
        cfg: RunConfig,
        model_dir: str,
        buffer,
        workers: list,
        num_threads: int | None,
        scratch_dir: str | None,
        checkpoints: CheckpointTarget | None,
        ranks: list | None,
    ) -> None:
        self.cfg = cfg
        self.watch = Watch()  # its steps and sends, for the driver's watchdog
        self.buffer = buffer
        self.workers = workers
        self.model_dir = model_dir
        self.ranks = list(ranks or [])
        if cfg.trainer.backend == "single":
            self.trainer = Trainer(self.cfg, model_dir, num_threads=num_threads)
        else:
            self.trainer = self._open_pool(num_threads)
        self._peers = _RayPeers(self.ranks) if self.ranks else None
        self.sender = make_sender(
            cfg.sync,
            num_receivers=len(workers),
            scratch_dir=scratch_dir,
            wire_dtype=wire_dtype(cfg),
            engine=driven_engine(cfg),
            ranks_per_receiver=cfg.inference.tensor_parallel_size,
        )
        if isinstance(self.sender, LoRASender) and self.trainer.base_checksum is not None:
            self.sender.base_checksum = self.trainer.base_checksum
        self.sender.attach(self.trainer.model)
        self.steps: list[StepRecord] = []
        self._steps_lock = threading.Lock()
        self._prefetch = None  # the next step's buffer.get, in flight while this one trains
        self._rows_in_flight_first = checkpoint_waits_for_rows_in_flight()  # a test's hook
        # Another: the first get waits for this many groups (0: none), checked before any loop starts.
        b = cfg.trainer.batch_groups
        held = os.environ.get(FIRST_BATCH_HOLD_ENV)
        self._hold = first_batch_hold(buffer_plan(cfg.buffer, cfg.mode, b, cfg.trainer), b, held)
        self._starved_s = 0.0
        self.checkpoints = checkpoints
        self._written: list[CheckpointRecord] = []  # periodic checkpoints since the last drain
        self._checkpoint_lock = threading.Lock()
        self._publish_first = False  # resumed: publish the restored version before training
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open_pool(self, num_threads: int | None):
        """Form the trainer pool with ranks 1.. (they build their parts meanwhile) and
        build this rank's part; returns its Trainer."""
        rendezvous = Rendezvous(self.cfg.trainer.num_ranks, POOL_TIMEOUT_S)
        joined = [r.join.remote(rendezvous.endpoint()) for r in self.ranks]
        pool = rendezvous.join(self.cfg.trainer.backend, assigned_device())
        trainer = Trainer(self.cfg, self.model_dir, num_threads=num_threads, pool=pool)
        ray.get(joined)  # a rank's error in building its part is raised here
        return trainer

    def _together(self, method: str, *args):
        """Start `method` on ranks 1.. (their part of a collective this rank starts now);
        returns what to wait on once this rank's part is done."""
        return [getattr(r, method).remote(*args) for r in self.ranks]

    def ready(self) -> bool:
        return raise_start_failure(self.start_failure)

    def where(self) -> dict:
        return where_am_i()

    def policy_checksum(self) -> str:
        """sha256 of the policy's weights under checkpoint names (workers.sync.base
        .state_checksum): equal checksums mean bit-identical policies."""
        if not self.trainer.sharded:
            return state_checksum(self.trainer.state_dict())
        # Sharded: taken a module at a time as the ranks gather it, never whole.
        others = self._together("follow_checksum")
        checksum = streamed_checksum(self.trainer.model)
        ray.get(others)
        return checksum

    def export(self, target: str) -> dict:
        """Write the policy as a Hugging Face directory at `target` (workers.train.export)."""
        others = self._together("follow_export") if self.trainer.sharded else []
        manifest = export_policy(self.trainer.model, self.model_dir, target, self.cfg)
        ray.get(others)
        return manifest

    def restore(self, location: str) -> int:
        """Take weights, optimizer, RNG states and version from the checkpoint at
        `location` (before the loop starts), ranks 1.. too; returns the restored version."""
        ckpt = Checkpoint(location)
        # A sharded checkpoint each rank reads its part of; a whole one rank 0 broadcasts.
        others = self._together("restore", read_version(ckpt), location if has_shards(ckpt) else None)
        self._starved_s = restore_trainer(self.trainer, ckpt)
        ray.get(others)
        self._publish_first = True
        return self.trainer.version

    def checkpoint(self) -> CheckpointRecord | None:
        """Write a checkpoint now (the run's end, its loops stopped); None if there is no
        checkpoint root or this version has one already."""
        if self.checkpoints is None:
            return None
        return self._checkpoint(self.checkpoints)

    def ledger(self) -> dict[str, float]:
        """The prompt ledger's totals (`ledger/*` metric values, workers/run/ledger.py)
        from the same snapshot a checkpoint takes."""
        with self._checkpoint_lock:
            workers, buffer = self._snapshot()
        return LedgerTotals.of(workers, buffer).metrics()

    def _snapshot_carrying_rows(self) -> tuple[list[dict], dict]:
        """Tests (CHECKPOINT_IN_FLIGHT_ENV): snapshots until one holds rows an inference
        worker drew and had not yet put, so that the checkpoint carries some. A snapshot
        only reads, so taking another is harmless; waiting for rows in flight and then
        taking one would race with the worker's put in between."""
        deadline = time.monotonic() + IN_FLIGHT_WAIT_LIMIT_S
        while True:
            workers, buffer = self._snapshot()
            received = set(buffer.get("received_ids", []))
            if any(carried(w, received) for w in workers):
                return workers, buffer
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{CHECKPOINT_IN_FLIGHT_ENV}: no snapshot within {IN_FLIGHT_WAIT_LIMIT_S:.0f} s of "
                    f"checkpoint step {self.trainer.version} held a row in flight"
                )
            time.sleep(0.01)

    def _snapshot(self) -> tuple[list[dict], dict]:
        """The inference workers' states, then the buffer's with the prefetched batch
        back at its head (the checkpoint lock held): the order the ledger's dedup of
        rows in flight relies on."""
        prefetched = self._settle_prefetch()
        workers = ray.get([w.state_dict.remote() for w in self.workers])
        return workers, with_prefetched(ray.get(self.buffer.state_dict.remote()), prefetched)

    def _checkpoint(self, target: CheckpointTarget, carrying_rows: bool = False) -> CheckpointRecord | None:
        """Gather the run's state (the inference workers' and the buffer's too) and write it;
        `carrying_rows`: a test hook's, see `_snapshot_carrying_rows`."""
        with self._checkpoint_lock:
            workers, buffer = self._snapshot_carrying_rows() if carrying_rows else self._snapshot()
            # A sharded pool's ranks each write their shards once the step directory is
            # there (`_shards`); a ddp rank 0 holds the whole state already.
            trainer = checkpoints.trainer_parts(self.trainer, self._starved_s, others=self._shards)
            parts = {
                **trainer,
                checkpoints.INFERENCE: workers,
                checkpoints.BUFFER: buffer,
            }
            return checkpoints.write_checkpoint(target, self.trainer.version, parts)

    def _shards(self, location: str, path: str):
        """Start ranks 1..'s part of a sharded checkpoint; what waits for their files."""
        refs = self._together("checkpoint_shards", location, path)
        return lambda: [f for files in ray.get(refs) for f in files]

    def _settle_prefetch(self) -> list[Group]:
        """The groups the get issued ahead for the next step brought, once it has answered
        (within its WAIT_S), so that none is both in the buffer's snapshot and taken.
        They stay this run's next batch."""
        if self._prefetch is None:
            return []
        groups, _ = ray.get(self._prefetch)
        if groups is None:
            self._prefetch = None
            return []
        return groups

    def sync_endpoint(self) -> dict:
        """What the inference workers need to `sync_connect` (opens a collective's rendezvous)."""
        return self.sender.endpoint()

    def sync_connect(self) -> None:
        """Join the inference workers (blocks until every rank joins, for a collective)."""
        self.sender.connect()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0, keep_sender: bool = False) -> int:
        """Finish the step in progress, then stop; returns the policy version it ends at.
        `keep_sender`: leave the weight sender open, since its last weights may still be
        on their way to an inference worker (the final eval pass); `close_sender` closes it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return self.trainer.version  # still inside a step or a send: the sender is in use
        if not keep_sender:
            self.sender.close()
        return self.trainer.version

    def close_sender(self) -> None:
        self.sender.close()

    def _send(self, version: int):
        """Publish `version`'s weights; a sharded pool's other ranks join the gathers."""
        if self.sender.every_rank_sends:
            others = self._together("send_beside", version)
        elif self.trainer.sharded:
            others = self._together("follow_sync", self.sender.gathers)
        else:
            others = []
        with self.watch.op(WEIGHT_SEND):
            sent = self.sender.send(version, self._notify)
            ray.get(others)
        return sent

    def _notify(self, notice: Notice) -> None:
        # Fire and forget: the inference workers receive concurrently with training.
        for w in self.workers:
            w.update_weights.remote(notice)

    def drain_metrics(self) -> TrainerReport:
        """Per-step records since the last drain (each with its window `t0`..`t1`)."""
        with self._steps_lock:
            steps, self.steps = self.steps, []
            written, self._written = self._written, []
        return TrainerReport(
            steps=steps,
            version=self.trainer.version,
            done=self.done,
            error=self.error,
            checkpoints=written,
            watch=self.watch.drain(),
        )

    def _next_batch(self) -> tuple[list[Group] | None, dict]:
        """The batch for the coming step. The get was issued before the previous step
        trained (prefetch), judged against the version this batch will train at, so
        the buffer's work and the transfer overlap training instead of idling it."""
        b = self.cfg.trainer.batch_groups
        while not self._stop.is_set():
            ref, self._prefetch = self._prefetch, None
            if ref is None:
                ref = self.buffer.get.remote(b, self.trainer.version, WAIT_S, self._hold)
            try:
                groups, stats = ray.get(ref)
            except NoSignalError as exc:
                # Ray wraps it in the buffer's traceback: the run's error is its own sentence.
                raise NoSignalError(str(getattr(exc, "cause", exc))) from None
            if groups is not None:
                self._hold = 0
                if self.trainer.version + 1 < self.cfg.stop.max_steps:
                    self._prefetch = self.buffer.get.remote(b, self.trainer.version + 1, WAIT_S)
                return groups, stats
        return None, {}

    def _replay_lets_train(self) -> bool:
        """In a replay, wait until the schedule lets the batch at hand be trained (every
        call and load the record has on its version or earlier made: workers/run/schedule.py);
        False if the run stops first, ReplayDiverged past TRAIN_WAIT_LIMIT_S."""
        version = self.trainer.version
        deadline = time.monotonic() + TRAIN_WAIT_LIMIT_S
        while not self._stop.is_set():
            waiting = ray.get(self.buffer.wait_trainable.remote(version, WAIT_S))
            if waiting is None:
                return True
            if time.monotonic() > deadline:
                raise ReplayDiverged(
                    f"replay stuck: the batch at policy version {version} waited {TRAIN_WAIT_LIMIT_S:.0f} s "
                    f"for {waiting}"
                )
        return False

    def _gpu_turn(self) -> bool:
        """Colocated, taking turns (inference.sleep_level): wait until every inference
        worker's vLLM sleeps, so the step's memory never meets vLLM's on a shared GPU
        (workers/run/colocation.py). False if the run stops first."""
        if not self.cfg.inference.sleep_level:
            return True
        while not self._stop.is_set():
            if all(ray.get([w.wait_asleep.remote(WAIT_S) for w in self.workers])):
                return True
        return False

    def _loop(self) -> None:
        try:
            t_prev = time.time()
            if self._publish_first:  # the checkpoint was written before its version was published
                self._send(self.trainer.version)
            replaying = ray.get(self.buffer.replaying.remote())
            while not self._stop.is_set() and self.trainer.version < self.cfg.stop.max_steps:
                t_wait = time.perf_counter()
                groups, buffer_stats = self._next_batch()
                if groups is None or not self._gpu_turn():
                    break
                if replaying and not self._replay_lets_train():
                    break
                wait_s = time.perf_counter() - t_wait
                self._starved_s += wait_s
                with self.watch.op(TRAIN_STEP):
                    metrics = self.trainer.train_step(groups, self._peers)
                version = self.trainer.version
                if self.checkpoints is not None and self.checkpoints.due(version):
                    # Before publishing `version`: in sync mode every inference worker
                    # waits for it, its sampling state still (workers.run.checkpoints).
                    written = self._checkpoint(self.checkpoints, carrying_rows=self._rows_in_flight_first)
                    if written is not None:
                        with self._steps_lock:
                            self._written.append(written)
                sent = self._send(version)
                t_end = time.time()
                window = max(t_end - t_prev, 1e-9)
                samples = sum(len(g.rollouts) for g in groups)
                for r in range(self.cfg.trainer.num_ranks if self.trainer.pool is not None else 0):
                    part = (
                        metrics[rank_series("trainer/rank_compute_s", r)]
                        + metrics[rank_series("trainer/rank_comm_s", r)]
                    )
                    metrics[rank_series("trainer/rank_busy_frac", r)] = min(1.0, part / window)
                record = StepRecord(
                    step=version,
                    t0=t_prev,
                    t1=t_end,
                    metrics={
                        **metrics,
                        **buffer_stats,
                        # The trainer's own wait: the buffer's would also count a prefetch
                        # that waited while the trainer was busy training.
                        "buffer/starved_s": self._starved_s,
                        "trainer/idle_frac": min(1.0, wait_s / window),
                        "samples/per_s": samples / window,
                        "sync/bytes": float(sent.bytes),
                        "sync/trainer_ms": sent.trainer_ms,
                    },
                )
                with self._steps_lock:
                    self.steps.append(record)
                t_prev = t_end
        except Exception as exc:
            self.error = record_failure(exc, self.cfg, "trainer", LOOP)
        finally:
            self.done = True
