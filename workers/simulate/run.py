"""`simulate(config, cluster, workload)`: a run config on a simulated cluster, with the
engine's own buffer, admission gate and staleness rejection, against cost models.

What runs as in the engine, imported from it: the buffer the config plans
(`workers.run.buffer.plan`: capacity, how far ahead, max_staleness, drop or requeue), the
`RolloutBuffer` itself (every group is put in and taken out of one, and its rejection
decides what is dropped or requeued), the `AdmissionGate` (AReaL's capacity rule, which
also makes a sync run alternate), and the update modes of workers/rollout/partial_rollouts.py.
The loops mirror the actors (workers/run/inference_worker.py): each inference worker asks the gate for
up to ⌈B / workers⌉ groups, generates them in one call, puts them (blocking while the
buffer is full), loads new weights between calls (drain) or between decode steps (the
stepped modes); the trainer takes B fresh groups, trains, sends the weights, and asks
for the next batch (at the next version) as soon as a step starts.

What is modelled instead of run: generation (workers/simulate/costs.py `DecodeCost`,
with completion lengths from `Workload`), training (`TrainCost`), weight sync
(`sync_cost`). Rewards are not modelled (dynamic sampling never drops a group).

The result has the engine's series (workers/core/metric_names.py) per trainer step, as a
driver's summary has them, and a summary of the run.
"""

from __future__ import annotations

import math
import queue
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from statistics import NormalDist
from typing import TYPE_CHECKING, cast

import numpy as np

from workers.rollout.partial_rollouts import STEPPED_MODES, PartialCounts, partial_metrics
from workers.run.buffer import AdmissionGate, RolloutBuffer, groups_per_call, plan
from workers.simulate.cluster import Cluster, Layout, layout
from workers.simulate.costs import (
    QWEN25_7B,
    WIRE_BYTES,
    CallProfile,
    Costs,
    DecodeCost,
    ModelShape,
    StreamingDecode,
    TrainCost,
    sync_cost,
)
from workers.simulate.events import EventLoop

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig
    from workers.core.records import Group

# 1.2816 = the standard normal's 90th percentile: a lognormal's p90 is median·e^(1.2816σ).
Z90 = 1.2816
# Call profiles sampled per call size and reused: more → more tail variety, slower start.
PROFILES_PER_SIZE = 32


@dataclass(frozen=True)
class Workload:
    """What a run generates: `prompt_tokens` per prompt and completions whose lengths are
    lognormal with `median_tokens` and `p90_tokens`, cut at `max_tokens` (equal median
    and p90: every completion that long)."""

    model: ModelShape = QWEN25_7B
    # A math or reasoning prompt with its chat template and few-shot preamble: 200–1,000 tokens.
    prompt_tokens: int = 512
    median_tokens: int = 2048
    p90_tokens: int = 2048
    max_tokens: int = 32768
    # `sync.delta`: the share of bf16 elements one step changes. bench/delta_sync.py
    # measures 2–4% at lr 1e-6 and 13–25% at 1e-5 (Qwen2.5-0.5B's shape, AdamW).
    delta_changed: float = 0.02

    def __post_init__(self) -> None:
        if not 1 <= self.median_tokens <= self.p90_tokens <= self.max_tokens:
            raise ValueError(
                f"workload needs 1 ≤ median_tokens ({self.median_tokens}) ≤ p90_tokens ({self.p90_tokens}) "
                f"≤ max_tokens ({self.max_tokens})"
            )
        if not 0 <= self.delta_changed <= 1:
            raise ValueError(f"workload.delta_changed is a share of elements, 0 to 1 (got {self.delta_changed})")

    @property
    def sigma(self) -> float:
        return math.log(self.p90_tokens / self.median_tokens) / Z90

    def lengths(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = self.median_tokens * np.exp(self.sigma * rng.standard_normal(n)) if self.sigma else None
        if draws is None:
            return np.full(n, self.median_tokens, dtype=np.int64)
        return np.clip(np.rint(draws), 1, self.max_tokens).astype(np.int64)

    def longest_of(self, sequences: float) -> float:
        """The expected longest of `sequences` completions: the lengths' quantile at
        n/(n+1), capped at max_tokens."""
        z = NormalDist().inv_cdf(sequences / (sequences + 1)) if sequences >= 1 else 0.0
        return min(self.median_tokens * math.exp(self.sigma * z), self.max_tokens)

    def mean_tokens(self) -> float:
        """Mean completion length (of the uncut lognormal, capped at max_tokens)."""
        return min(self.median_tokens * math.exp(self.sigma**2 / 2), self.max_tokens)


@dataclass(eq=False, slots=True)
class SimGroup:
    """A group as the buffer sees it (workers.core.records.Group's fields the buffer reads)
    and what the trainer's staleness metrics need."""

    group_id: str
    prompt: str
    min_version: int
    tokens: float  # completion tokens
    version_tokens: float  # Σ version × tokens, for the token-weighted staleness
    answer: str = ""
    uniform: bool = False


@dataclass
class _Call:
    groups: int
    prompts: list[str]
    profile: CallProfile
    pstart: float  # when the current profile's clock started
    end: float
    version: int  # the version generating now
    seq_version: np.ndarray  # per sequence: the version of its first token
    live: np.ndarray  # the current profile's sequences, as indices into seq_version
    paused: float = 0.0  # pauses since pstart (weight loads, re-prefill)
    tau_mark: float = 0.0  # profile clock when `version` took over
    done: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # version → tokens


@dataclass
class _Worker:
    index: int
    version: int = 0
    staged: int | None = None
    call: _Call | None = None
    blocked: list[SimGroup] = field(default_factory=list)
    blocked_since: float = 0.0
    parked: bool = False  # waiting for admission, weights or (colocated) the GPUs
    handing_off: bool = False  # in its calls to the buffer after a generate call


@dataclass
class SimResult:
    """`series`: {name: [(step, value), ...]} (the engine's names); `summary`: the run."""

    series: dict[str, list[tuple[int, float]]]
    summary: dict[str, float]
    samples_at: list[tuple[float, int]]  # (simulated seconds, trained samples) per step

    def time_to_samples(self, samples: int) -> float | None:
        """Simulated seconds until `samples` were trained (None: never in this run)."""
        for t, n in self.samples_at:
            if n >= samples:
                return t
        return None


def roofline_costs(
    cfg: RunConfig,
    cluster: Cluster,
    lay: Layout,
    workload: Workload,
    *,
    wire_bytes: int = WIRE_BYTES,
    tensors: int | None = None,
) -> Costs:
    """The cost models of `cluster`'s hardware for `workload`'s model, laid out as `lay`.
    `wire_bytes` and `tensors`: what a weight sync sends (the engine's float32 master
    weights, its state dict's tensors, unless said: another system sends bfloat16 and
    its checkpoint's tensors)."""
    model = workload.model
    decode = DecodeCost(model, cluster.device, lay.tp, workload.prompt_tokens)
    train = TrainCost(
        model,
        lay.trainer_ranks,
        cluster.device,
        lora_rank=cfg.lora.rank if cfg.lora.enabled else None,
        grad_link_bytes_per_s=lay.grad_link.bytes_per_s,
    )
    sync = sync_cost(
        cfg.sync.protocol,
        model,
        link=lay.sync_link,
        workers=lay.workers,
        nodes=lay.inference_nodes,
        packed=cfg.sync.packed,
        bucket_mb=cfg.sync.bucket_mb,
        lora_rank=cfg.lora.rank,
        device=cluster.device,
        delta_changed=workload.delta_changed if cfg.sync.delta else None,
        wire_bytes=wire_bytes,
        tensors=tensors,
    )
    # Colocated: the GPUs switch between the engine and the trainer (vLLM sleep /
    # wake_up): the weights go to host memory and back, once each way per step.
    switch_s = 2 * decode.weight_bytes / lay.tp / cluster.device.host_bytes_per_s
    return Costs(decode, train, sync, switch_s)


def simulate(
    config: RunConfig,
    cluster: Cluster,
    workload: Workload,
    steps: int | None = None,
    seed: int | None = None,
    *,
    costs: Costs | None = None,
    streaming: bool = False,
) -> SimResult:
    """Run `config` on `cluster` for `steps` trainer steps (config.stop.max_steps by
    default) generating `workload`; `seed` (config.seed by default) draws the lengths.
    `costs`: what generation, training and weight sync cost (the cluster's roofline
    models by default; workers/simulate/measured.py reads them off a real run).
    `streaming`: generation as a rollout server that streams (verl's and AReaL's) does
    it instead of as the engine's inference worker does (`StreamingDecode`)."""
    return _Simulation(config, cluster, workload, steps or config.stop.max_steps, seed, costs, streaming).run()


class _Simulation:
    def __init__(
        self,
        cfg: RunConfig,
        cluster: Cluster,
        workload: Workload,
        steps: int,
        seed: int | None,
        costs: Costs | None,
        streaming: bool = False,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be ≥ 1 (got {steps})")
        self.cfg, self.workload, self.steps = cfg, workload, steps
        self.lay: Layout = layout(cluster, cfg.placement.mode)
        self.rng = np.random.default_rng(cfg.seed if seed is None else seed)
        # Its own stream, so drawing sync latencies leaves the completion lengths as they were.
        self.latency_rng = np.random.default_rng((cfg.seed if seed is None else seed) + 1)
        tc = cfg.trainer
        self.B, self.G = tc.batch_groups, tc.group_size
        self.minibatches = tc.minibatches
        bp = plan(cfg.buffer, cfg.mode, self.B, tc)
        self.plan = bp
        # The buffer's own capacity check (get ≤ capacity) would refuse a batch bigger
        # than a 'none' or 'double' buffer's one batch: they are B groups here too.
        self.buffer = RolloutBuffer(bp.capacity_groups, bp.max_staleness, bp.on_stale)
        self.gate = AdmissionGate(self.B, bp.ahead_batches, bp.overcommit_groups)
        self.admitted = 0
        self.mode = cfg.sync.update_mode
        self.stepped = self.mode in STEPPED_MODES
        self.costs = costs or roofline_costs(cfg, cluster, self.lay, workload)
        self.decode, self.train, self.sync = self.costs.decode, self.costs.train, self.costs.sync
        self.slots = self.decode.slots(workload.mean_tokens())
        # Each inference worker is `lanes` workers of the loop: one per group in flight.
        # A freed slot takes the next prompt's sequence, so with every slot busy the
        # groups in flight are, by Little's law, slots × (a group's longest completion /
        # a completion's mean) / group size.
        lanes = 1
        self.streaming = streaming
        if streaming:
            stream = StreamingDecode.of(self.decode, self.slots, workload.prompt_tokens, workload.mean_tokens())
            spread = workload.longest_of(self.G) / workload.mean_tokens()
            self.decode, lanes, self.slots = stream, max(1, round(self.slots * spread / self.G)), self.G
        self.n_workers = self.lay.workers * lanes
        self.load_s = self.decode.load_seconds()
        self.switch_s = self.costs.switch_s
        self.chunk = 1 if streaming else groups_per_call(self.B, self.n_workers)
        self.loop = EventLoop()
        self.workers = [_Worker(i) for i in range(self.n_workers)]
        self.profiles: dict[int, list[CallProfile]] = {}
        self.retry_profiles: dict[tuple[int, int], CallProfile] = {}
        self.counts = PartialCounts()
        self.groups_made = 0
        self.tokens_made = 0.0
        self.tokens_wasted = 0.0
        # The trainer.
        self.version = 0
        self.training = False
        self.batch: list[SimGroup] | None = None  # taken for the next step
        self.wait_started = 0.0
        self.t_prev = 0.0
        self.trained_samples = 0
        self.train_busy_s = 0.0
        self.starved_s = 0.0
        # Inference busy time, integrated as the count of generating workers changes.
        self.generating = 0
        self.busy_integral = 0.0
        self.busy_mark = 0.0
        self.busy_at_prev = 0.0
        self.overlap_s = 0.0  # time the trainer trained while some worker generated
        self.tokens_at_prev = 0.0
        self.backpressure_s = 0.0
        self.backpressure_at_prev = 0.0
        self.handoff_s = 0.0
        self.handoff_at_prev = 0.0
        self.published: dict[int, float] = {}
        self.loaded: dict[int, list[float]] = defaultdict(list)
        self.series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.samples_at: list[tuple[float, int]] = []

    # -- the run ---------------------------------------------------------------

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.loop.at(0.0, self._start_workers)
        self.loop.run(until=lambda: self.version >= self.steps)
        if self.version < self.steps:
            raise RuntimeError(
                f"the simulation stalled at step {self.version} of {self.steps}: nothing left to happen "
                f"(buffer depth {self.buffer.depth}, admitted {self.admitted}, rejected {self.buffer.rejected})"
            )
        return SimResult(dict(self.series), self._summary(time.perf_counter() - t0), self.samples_at)

    def _summary(self, wall_s: float) -> dict[str, float]:
        now = self.loop.now
        self._busy_to(now)
        rejected = self.buffer.dropped_stale + self.buffer.requeued
        stale = [v for _, v in self.series["staleness/mean"]]
        lat = [v for _, v in self.series.get("sync/latency_ms", [])]
        return {
            "steps": float(self.version),
            "seconds": now,
            "samples_per_s": self.trained_samples / now,
            "trainer_busy": self.train_busy_s / now,
            "inference_busy": self.busy_integral / (self.n_workers * now),
            "overlap": self.overlap_s / now,
            "staleness_mean": float(np.mean(stale)),
            "staleness_max": max(v for _, v in self.series["staleness/max"]),
            "dropped_share": rejected / max(self.groups_made, 1),
            "wasted_token_share": self.tokens_wasted / max(self.tokens_made + self.tokens_wasted, 1.0),
            # End to end as the engine measures it: a drain waits for the call in flight.
            "sync_latency_ms": float(np.mean(lat)) if lat else math.nan,
            "sync_transfer_ms": self.sync.latency_s * 1e3,
            "inference_workers": float(self.lay.workers),
            "trainer_ranks": float(self.lay.trainer_ranks),
            "events": float(self.loop.events),
            "wall_s": wall_s,
        }

    # -- inference workers -------------------------------------------------------

    def _busy_to(self, t: float) -> None:
        """Integrate the busy counts up to `t`; call before either count changes."""
        dt = t - self.busy_mark
        self.busy_integral += self.generating * dt
        if self.training and self.generating:
            self.overlap_s += dt
        self.busy_mark = t

    def _gpus_taken(self) -> bool:
        """Colocated: the trainer holds the GPUs, or waits for them with its batch."""
        return self.lay.colocated and (self.training or self.batch is not None)

    def _next(self, w: _Worker) -> None:
        """The worker's loop, once: load staged weights, ask the gate, generate."""
        w.parked = False
        if w.call is not None or w.blocked or w.handing_off or self.version >= self.steps:
            return
        if self._gpus_taken():
            w.parked = True
            return
        load = 0.0
        if w.staged is not None and w.staged > w.version:
            w.version, w.staged, load = w.staged, None, self.load_s
            self._loaded(w.version, self.loop.now + load)
        n = self.gate.may_admit(w.version, self.admitted, self.buffer.rejected, self.chunk)
        if n == 0:
            w.parked = True  # until new weights, or a rejection frees places
            return
        self.admitted += n
        requeued = self.buffer.take_requeued(n) if self.plan.on_stale == "requeue" else []
        prompts = [cast("SimGroup", g).prompt for g in requeued]
        prompts += [f"p{self.groups_made + i}" for i in range(n - len(prompts))]
        self.groups_made += n
        self._start_call(w, n, prompts, self.loop.now + load)

    def _profile(self, sequences: int) -> CallProfile:
        if self.streaming:
            # A lane's profile costs a multiplication: fresh lengths every call keep the
            # batch's tail (its longest sequences) as varied as the workload's.
            return self.decode.call(self.workload.lengths(self.rng, sequences), self.slots)
        cached = self.profiles.setdefault(sequences, [])
        k = int(self.rng.integers(PROFILES_PER_SIZE))
        while len(cached) <= k:
            cached.append(self.decode.call(self.workload.lengths(self.rng, sequences), self.slots))
        return cached[k]

    def _retry_profile(self, prof: CallProfile, left: np.ndarray) -> CallProfile:
        """The profile of `prof`'s unfinished sequences generated again: which they are
        depends only on how many have ended, so it is cached with `prof`."""
        if self.streaming:
            # Streaming profiles are not kept, so their ids are reused: nothing to cache by.
            return self.decode.call(prof.lengths[np.sort(left)], self.slots)
        key = (id(prof), len(left))
        cached = self.retry_profiles.get(key)
        if cached is None:
            cached = self.retry_profiles[key] = self.decode.call(prof.lengths[np.sort(left)], self.slots)
        return cached

    def _start_call(self, w: _Worker, n: int, prompts: list[str], start: float) -> None:
        m = n * self.G
        profile = self._profile(m)
        call = _Call(
            n,
            prompts,
            profile,
            start,
            start + profile.seconds,
            w.version,
            np.full(m, w.version, dtype=np.int64),
            np.arange(m),
        )
        w.call = call
        self._busy_to(self.loop.now)
        self.generating += 1
        self.loop.at(call.end, partial(self._call_ends, w, call))

    def _start_workers(self) -> None:
        for w in self.workers:
            self._next(w)

    def _weights_arrive_all(self, version: int) -> None:
        for w in self.workers:
            self._weights_arrive(w, version)

    def _weights_arrive(self, w: _Worker, version: int) -> None:
        if w.version >= version or (w.staged is not None and w.staged >= version):
            return
        w.staged = version
        call = w.call
        if call is not None and self.stepped and self.loop.now < call.end:
            self._update_mid_call(w, call)
        elif w.parked:
            self._next(w)

    def _update_mid_call(self, w: _Worker, call: _Call) -> None:
        """New weights between two decode steps (workers/rollout/partial_rollouts.py)."""
        now = self.loop.now
        assert w.staged is not None
        new = w.staged
        w.version, w.staged = new, None
        self._loaded(new, now + self.load_s)
        tau = max(0.0, now - call.pstart - call.paused)
        prof = call.profile
        left = prof.unfinished(tau)
        live = len(left)
        finished = prof.finished_tokens(tau)
        generated = prof.tokens_by(tau)
        self.counts.mid_generation_updates += 1
        if self.mode == "in_flight" or self.mode == "abort_resume":
            call.done[call.version] += generated - prof.tokens_by(call.tau_mark)
            call.tau_mark, call.version = tau, new
            pause = self.load_s
            if self.mode == "abort_resume":
                self.counts.aborted += live
                self.counts.resumed += live
                pause += self.decode.prefill_seconds(generated - finished + live * self.workload.prompt_tokens)
            call.paused += pause
            call.end += pause
        else:  # abort_retry: the unfinished sequences start again from their prompts
            self.counts.aborted += live
            self.counts.retried += live
            call.done[call.version] += finished - prof.tokens_by(call.tau_mark)
            self.tokens_wasted += generated - finished
            call.live = call.live[left]
            call.seq_version[call.live] = new
            call.profile = self._retry_profile(prof, left)
            call.pstart, call.paused, call.tau_mark, call.version = now + self.load_s, 0.0, 0.0, new
            call.end = call.pstart + call.profile.seconds
        self.loop.at(call.end, partial(self._call_ends, w, call))

    def _call_ends(self, w: _Worker, call: _Call) -> None:
        if w.call is not call or self.loop.now < call.end:
            return  # rescheduled by a mid-call update
        w.call = None
        self._busy_to(self.loop.now)
        self.generating -= 1
        prof = call.profile
        call.done[call.version] += prof.tokens - prof.tokens_by(call.tau_mark)
        tokens = sum(call.done.values())
        self.tokens_made += tokens
        mean_version = sum(v * t for v, t in call.done.items()) / max(tokens, 1.0)
        mins = call.seq_version.reshape(call.groups, self.G).min(axis=1)
        per_group = tokens / call.groups
        w.blocked = [
            SimGroup(
                f"g{self.groups_made}-{w.index}-{i}",
                call.prompts[i],
                int(mins[i]),
                per_group,
                mean_version * per_group,
            )
            for i in range(call.groups)
        ]
        handoff = self.decode.handoff_seconds()
        if handoff > 0:
            w.handing_off = True
            self.handoff_s += handoff
            self.loop.after(handoff, partial(self._handed_off, w))
        else:
            w.blocked_since = self.loop.now
            self._put(w)
        if self.lay.colocated and self.batch is not None and self.generating == 0 and not self.training:
            self._train()

    def _handed_off(self, w: _Worker) -> None:
        w.handing_off = False
        w.blocked_since = self.loop.now
        self._put(w)

    def _put(self, w: _Worker) -> None:
        """Put the worker's groups in order while there is room (the engine's put blocks)."""
        stale_at = self._next_train_version() - self.plan.max_staleness
        taken = self.buffer.offer(cast("list[Group]", w.blocked))
        put, w.blocked = w.blocked[:taken], w.blocked[taken:]
        if put:
            # Already stale: the engine's polling get rejects it now.
            self._try_take(force=min(g.min_version for g in put) < stale_at)
        if w.blocked:
            return  # backpressure: woken when the trainer takes a batch
        self.backpressure_s += self.loop.now - w.blocked_since
        self._next(w)

    # -- the trainer -------------------------------------------------------------

    def _next_train_version(self) -> int:
        return self.version + (1 if self.training else 0)

    def _try_take(self, force: bool = False) -> None:
        """The trainer's get for its next step (issued as a step starts, as the engine's
        prefetch is): B fresh groups at the version it will train at, stale ones rejected."""
        target = self._next_train_version()
        if self.batch is not None or target >= self.steps:
            return
        if not force and self.buffer.depth < self.B:
            return
        rejected = self.buffer.rejected
        try:
            got = self.buffer.get(self.B, target, timeout=0)
        except queue.Empty:
            got = None
        if self.buffer.rejected != rejected:
            self._wake_parked()  # rejected groups give their places back to the gate
        if got is None:
            return
        self.batch = cast("list[SimGroup]", got)
        self._unblock()
        if not self.training:
            if self.lay.colocated and self.generating:
                return  # the GPUs are still generating: the last call to end starts the step
            self._train()

    def _unblock(self) -> None:
        for w in self.workers:
            if w.blocked and not w.handing_off:
                self._put(w)

    def _wake_parked(self) -> None:
        for w in self.workers:
            if w.parked:
                self._next(w)

    def _train(self) -> None:
        assert self.batch is not None
        batch, self.batch = self.batch, None
        now = self.loop.now
        self._busy_to(now)
        self.training = True
        wait = now - self.wait_started
        tokens = sum(g.tokens for g in batch)
        prompt = self.workload.prompt_tokens
        # Each minibatch's longest sequence, as the workload's lengths make it (the
        # expected longest of that many draws): the rank that holds it ends the pass last.
        parts = min(self.minibatches, len(batch))
        longest = [self.workload.longest_of(len(batch) * self.G / parts) + prompt] * parts
        step_s = self.train.seconds(tokens + len(batch) * self.G * prompt, longest)
        seconds = step_s + self.sync.trainer_s + self.train.overhead_seconds()
        seconds += self.switch_s if self.lay.colocated else 0.0
        self.train_busy_s += seconds
        v = self.version
        staleness = sum((v * g.tokens - g.version_tokens) for g in batch) / max(tokens, 1.0)
        stale_max = v - min(g.min_version for g in batch)
        self.loop.after(seconds, partial(self._trained, batch, wait, step_s, staleness, stale_max))
        self._try_take(force=True)  # the prefetch of the next batch

    def _trained(self, batch: list[SimGroup], wait: float, step_s: float, staleness: float, stale_max: int) -> None:
        now = self.loop.now
        self._busy_to(now)
        self.training = False
        self.version += 1
        v = self.version
        self.starved_s += wait
        samples = len(batch) * self.G
        self.trained_samples += samples
        window = max(now - self.t_prev, 1e-9)
        self._busy_to(now)
        busy = (self.busy_integral - self.busy_at_prev) / (self.n_workers * window)
        emit = self.series
        buf = self.buffer
        point = {
            "samples/per_s": samples / window,
            # As the engine measures it: the step's own compute, not the wait or the send.
            "trainer/step_s": step_s,
            "trainer/idle_frac": min(1.0, wait / window),
            "inference/idle_frac": max(0.0, 1.0 - busy),
            "inference/tokens_per_s": (self.tokens_made - self.tokens_at_prev) / window,
            "staleness/mean": staleness,
            "staleness/max": float(stale_max),
            "rollout/backpressure_s": self.backpressure_s - self.backpressure_at_prev,
            "rollout/handoff_s": self.handoff_s - self.handoff_at_prev,
            "sync/bytes": self.sync.bytes,
            "sync/trainer_ms": self.sync.trainer_s * 1e3,
            "sync/inference_ms": self.load_s * 1e3,
            "completion/length_mean": sum(g.tokens for g in batch) / samples,
            "policy/version": float(v),
            **buf.stats(),
            # The trainer's own wait, as the engine reports it (not the buffer's clock).
            "buffer/starved_s": self.starved_s,
            **partial_metrics([self.counts]),
        }
        for name, value in point.items():
            emit[name].append((v, float(value)))
        self.samples_at.append((now, self.trained_samples))
        self.t_prev, self.busy_at_prev, self.tokens_at_prev = now, self.busy_integral, self.tokens_made
        self.backpressure_at_prev = self.backpressure_s
        self.handoff_at_prev = self.handoff_s
        self.wait_started = now
        self.published[v] = now
        if v >= self.steps:
            return
        # Every worker at once: one event, in worker order.
        self.loop.after(self._sync_latency(), partial(self._weights_arrive_all, v))
        if self.lay.colocated:
            self._wake_parked()
        self._try_take(force=self.batch is None)
        if self.batch is not None and not self.training and not (self.lay.colocated and self.generating):
            self._train()

    def _sync_latency(self) -> float:
        draws = self.sync.latency_draws
        return draws[int(self.latency_rng.integers(len(draws)))] if draws else self.sync.latency_s

    def _loaded(self, version: int, t: float) -> None:
        """A worker has `version` live at `t`: one sync/latency_ms point per version, the
        slowest worker's, once every worker has it (as the driver's)."""
        times = self.loaded[version]
        times.append(t)
        if len(times) == self.n_workers and version in self.published:
            self.series["sync/latency_ms"].append((version, (max(times) - self.published[version]) * 1e3))
            del self.loaded[version]
