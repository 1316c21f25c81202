"""Partial rollouts: what generation in flight does when new weights arrive.

`sync.update_mode` chooses (the peers' names for each are in workers/config/run_config.py):

- ``drain``: a generate call finishes on the weights it started with; new weights are
  loaded between two calls. Every token of a call has one version. (The inference
  worker calls `backend.generate`; nothing here runs but the staging.)
- ``abort_retry``: at the first decode step after new weights are staged, the rows
  still generating are aborted, the weights loaded, and those rows generated again from
  their prompt. Their partial tokens are thrown away: every kept token has the new version.
- ``abort_resume``: the same abort, then each row continues from the tokens it kept:
  prompt + kept tokens are prefilled again under the new weights and generation goes on
  with the remaining budget. Kept tokens keep their old logprobs and versions.
- ``in_flight``: the weights are loaded between two decode steps and generation goes
  on; the KV already computed stays (stale KV), each token carries the version whose
  weights computed its logits, so one sequence may mix versions.

This module holds all of it: the mode is read once into an `UpdatePolicy`, which
generation asks at its decision points; the inference worker stages the weights it receives here
(`StagedWeights`, the newest version only), the stepped modes poll them between two
decode steps (`WeightUpdates`) through a backend's `DecodeSession`
(workers/inference/base.py; `UpdatePolicy.exact_steps` when a backend must be built for them), and
the counts (`PartialCounts`: sequences aborted, resumed, retried, and weight loads in
the middle of a generation) become the run's rollout/partial_* series (`partial_metrics`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

from workers.config.run_config import RunConfig, UpdateMode
from workers.inference.base import DecodeSession, InferenceBackend, PauseMode


@dataclass(frozen=True)
class UpdatePolicy:
    """`sync.update_mode`, decided once per inference worker (`of`): what generation asks
    at its few decision points; nothing else on the rollout path reads the mode.

    - `stepped`: weights may arrive between two decode steps of a call (all but drain);
      the backend is built for it (`exact_steps`), and a call polls what is staged
      (`offered`); under drain it polls nothing and runs on one version.
    - `aborts`: the rows still generating are aborted when weights arrive (abort_retry,
      abort_resume), else they go on with their KV (in_flight);
    - `keeps_tokens`: an aborted row continues from its tokens (abort_resume), else it
      starts again from its prompt (abort_retry);
    - `loads_between_calls` / `admits_while_pending`: the episode loop's two questions;
    - `pause_mode` and `clear_cache`: the same mode in vLLM's pause vocabulary
      (`AsyncLLM.pause_generation(mode=..., clear_cache=...)`), which a vLLM session
      takes weights through (workers.inference.vllm_backend.VLLMSession.take_weights).
    """

    mode: UpdateMode = "drain"

    @classmethod
    def of(cls, cfg: RunConfig) -> UpdatePolicy:
        return cls(cfg.sync.update_mode)

    @property
    def stepped(self) -> bool:
        return self.mode != "drain"

    @property
    def exact_steps(self) -> bool:
        """Whether an inference backend must be built so that one engine step is one
        decode step of every running sequence: weights loaded between two steps then
        produce the very next token (vLLM's async scheduling would run a step ahead)."""
        return self.stepped

    @property
    def aborts(self) -> bool:
        return self.mode in ("abort_retry", "abort_resume")

    @property
    def keeps_tokens(self) -> bool:
        return self.mode != "abort_retry"

    @property
    def pause_mode(self) -> PauseMode:
        """drain waits for the rows to finish; in_flight keeps them, their KV as it is;
        abort_resume keeps them and clears the cache (vLLM then preempts them and
        recomputes prompt + tokens so far under the new weights: a re-prefill);
        abort_retry aborts them."""
        if self.mode == "drain":
            return "wait"
        return "abort" if self.mode == "abort_retry" else "keep"

    @property
    def clear_cache(self) -> bool:
        """Whether the KV of the rows running when weights load is thrown away."""
        return self.aborts

    def offered(self, updates: WeightUpdates | None) -> WeightUpdates:
        """What a call polls between two decode steps: `updates` in a stepped mode;
        nothing under drain (weights staged meanwhile wait for the next call)."""
        return updates if self.stepped and updates is not None else NoUpdates()

    def loads_between_calls(self, in_flight: bool) -> bool:
        """Whether staged weights may load now while `in_flight` says episodes are still
        mid-generation (the episode loop): drain loads only with none in flight."""
        return self.stepped or not in_flight

    def admits_while_pending(self) -> bool:
        """Whether new episodes may start while weights wait to load: not under drain,
        whose waiting weights load once the episodes in flight have ended."""
        return self.stepped


DRAIN = UpdatePolicy("drain")
# The modes that take new weights between two decode steps (the simulator's cost model).
STEPPED_MODES = tuple(m for m in get_args(UpdateMode) if UpdatePolicy(m).stepped)


class WeightUpdates(Protocol):
    """The inference worker's view of weights that arrived while it generates."""

    def pending(self) -> bool:
        """New weights are staged and not loaded yet (cheap: called every decode step)."""
        ...

    def apply(self) -> int:
        """Load the staged weights into the backend; returns the version now loaded."""
        ...


class NoUpdates:
    """No weights ever arrive (drain: a call runs on the weights it started with)."""

    def pending(self) -> bool:
        return False

    def apply(self) -> int:
        raise AssertionError("NoUpdates.apply: nothing was pending")


class StagedWeights:
    """Weights an inference worker has received and not loaded yet: the newest version
    only. `stage` keeps what arrives (any thread); the inference worker loads it between
    two generate calls, and the stepped modes between two decode steps too (`pending`
    and `apply`: the WeightUpdates that generate_across_updates polls).

    `load(staged)` puts staged weights into the backend; `version()` is the version the
    backend holds."""

    def __init__(self, load: Callable[[Any], None], version: Callable[[], int]) -> None:
        self._load, self._version = load, version
        self._staged: tuple[int, Any] | None = None  # (version, staged weights)
        self._lock = threading.Lock()

    def stage(self, staged: Any, version: int) -> None:
        """Keep `staged` (weights of `version`) unless a newer version is staged already."""
        with self._lock:
            if self._staged is None or self._staged[0] < version:
                self._staged = (version, staged)

    def pending(self) -> bool:
        return self._staged is not None

    def staged_version(self) -> int | None:
        """The version staged and not loaded yet; None if none is."""
        staged = self._staged
        return staged[0] if staged is not None else None

    def apply(self) -> int:
        """Load what is staged, if anything; returns the version the backend holds now."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            self._load(staged[1])
        return self._version()


# Test-only switch (the inference worker reads it, `weights_mid_generation_forced`): with
# it set to "1", a stepped mode's generate call waits after its first decode step until
# newer weights are staged (`WeightsMidGeneration`), and the worker loads weights only
# there, never between two calls. Whether weights land inside a generation otherwise
# depends on how fast the trainer is next to the generation; a test of the stepped modes
# sets it (through Ray's runtime_env) so that every call after the first takes a new
# version mid-generation, whatever the host's load.
WEIGHTS_MID_GENERATION_ENV = "ROLLWAY_TEST_WEIGHTS_MID_GENERATION"

# How long the forced wait lasts before it calls the run broken: far past a trainer step
# on a loaded host; only a run where the trainer can never publish (a misuse of the
# switch) reaches it, and fails with this module's message instead of hanging.
MID_GENERATION_WAIT_LIMIT_S = 600.0


def weights_mid_generation_forced() -> bool:
    """Whether this process runs under WEIGHTS_MID_GENERATION_ENV."""
    return os.environ.get(WEIGHTS_MID_GENERATION_ENV) == "1"


class WeightsMidGeneration:
    """The WeightUpdates of one generate call that forces new weights to arrive in its
    middle: its first `pending()` (which generate_across_updates asks after the first
    decode step, while sequences still generate) waits until `staged` holds newer weights,
    or `stopping` is set. `due`: the trainer can publish a newer version without this
    call's groups (the caller knows; the first call of a run cannot wait for one). Later
    `pending()` calls, and `apply`, are `staged`'s own."""

    def __init__(self, staged: WeightUpdates, due: bool, stopping: threading.Event, poll_s: float = 0.05) -> None:
        self.staged, self.stopping, self.poll_s = staged, stopping, poll_s
        self._waited = not due

    def pending(self) -> bool:
        if not self._waited:
            self._waited = True
            deadline = time.monotonic() + MID_GENERATION_WAIT_LIMIT_S
            while not self.staged.pending() and not self.stopping.wait(self.poll_s):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{WEIGHTS_MID_GENERATION_ENV}: no new weights within {MID_GENERATION_WAIT_LIMIT_S:.0f} s "
                        "of a generation that waited for them; the switch needs a run whose trainer steps "
                        "without this call's groups (async)"
                    )
        return self.staged.pending()

    def apply(self) -> int:
        return self.staged.apply()


@dataclass
class PartialCounts:
    """Sequences aborted, resumed and retried, and weight loads in the middle of a
    generation (cumulative, per inference worker)."""

    aborted: int = 0
    resumed: int = 0
    retried: int = 0
    mid_generation_updates: int = 0

    def add(self, other: PartialCounts) -> None:
        self.aborted += other.aborted
        self.resumed += other.resumed
        self.retried += other.retried
        self.mid_generation_updates += other.mid_generation_updates

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for name, value in state.items():
            setattr(self, name, int(value))


def partial_metrics(counts: list[PartialCounts]) -> dict[str, float]:
    """The rollout/partial_* series (workers/core/metric_names.py) from each inference
    worker's counts: cumulative over the run and all of them."""
    return {
        "rollout/partial_aborted": float(sum(c.aborted for c in counts)),
        "rollout/partial_resumed": float(sum(c.resumed for c in counts)),
        "rollout/partial_retried": float(sum(c.retried for c in counts)),
    }


@dataclass
class PartialSequence:
    """One completion being built, with what each token came from."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "turn" (ended by `ends_turn`)
    # The experts an MoE model chose for the prompt and these tokens (workers.core.routing),
    # as the last session that ran them recorded them; None when none was recorded.
    routing: Any | None = None
    # Per token, the set it was drawn from (workers.core.sampling_mask.Kept) or None; empty
    # from a backend that records none.
    kept: list[Any] = field(default_factory=list)

    def reset(self) -> None:
        self.token_ids, self.logprobs, self.versions, self.kept = [], [], [], []
        self.routing = None


@dataclass
class Generation:
    """What `generate_across_updates` returns: `n` sequences per prompt (prompt-major),
    the version loaded at the end, and the counts."""

    sequences: Sequence[Sequence[PartialSequence]]
    version: int
    counts: PartialCounts


def generate_across_updates(
    backend: InferenceBackend,
    prompts: list[list[int]],
    n: int,
    max_new_tokens: int | list[int],
    temperature: float,
    seed: int,
    version: int,
    policy: UpdatePolicy,
    updates: WeightUpdates | None,
    ends_turn: Callable[[PartialSequence], bool] | None = None,
    on_step: Callable[[list[PartialSequence]], None] | None = None,
) -> Generation:
    """Generate `n` completions per prompt, one decode step at a time, taking new weights
    as `policy` says whenever `updates.pending()` between two steps (under drain none
    are taken: every token has `version`).

    `max_new_tokens`: one budget for every prompt, or one per prompt. `ends_turn`
    (multi-turn episodes, workers/rollout/episodes.py): called after each token a sequence gets;
    True ends that sequence there with finish_reason "turn" (a tool call), and the tokens
    its session row still samples are dropped. An abort_retry then regenerates only the
    sequences still generating: what a sequence holds here is one turn. `on_step` (the
    pipelined reward stage, workers/rollout/reward_stage.py) is called with every sequence,
    prompt-major, after each decode step."""
    updates = policy.offered(updates)
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    seqs = [PartialSequence(list(p)) for p in prompts for _ in range(n)]
    counts = PartialCounts()
    rows = list(range(len(seqs)))  # session row → index in seqs
    attempt = 0
    session = backend.start(prompts, budgets, temperature, seed, n=n)
    try:
        while True:
            for st in session.step():
                s = seqs[rows[st.row]]
                if s.finish_reason == "turn":
                    continue
                s.token_ids.append(st.token)
                s.logprobs.append(st.logprob)
                s.versions.append(version)
                s.kept.append(st.kept)
                s.finish_reason = st.finish_reason
                if ends_turn is not None and ends_turn(s):
                    s.finish_reason = "turn"
            if on_step is not None:
                on_step(seqs)
            # A backend row whose sequence ended its turn still decodes (the session
            # interface has no per-row stop); it no longer counts as generating.
            live = [r for r in session.unfinished() if seqs[rows[r]].finish_reason != "turn"]
            if not live:
                break
            if not updates.pending():
                continue
            if policy.aborts:  # a resumed row's routing is recorded afresh by its next session
                _keep_routing(session, seqs, rows)
            version, goes_on = take_weights(session, updates.apply, policy)
            counts.mid_generation_updates += 1
            if not policy.aborts:
                continue
            aborted = [rows[r] for r in live]
            counts.aborted += len(aborted)
            if policy.keeps_tokens:
                counts.resumed += len(aborted)
            else:
                for i in aborted:
                    seqs[i].reset()
                counts.retried += len(aborted)
            if goes_on:  # the engine re-prefilled them itself, in this session
                continue
            rows = aborted
            attempt += 1
            session = backend.start(
                [seqs[i].prompt_ids + seqs[i].token_ids for i in rows],
                [budgets[i // n] - len(seqs[i].token_ids) for i in rows],
                temperature,
                # A new stream per attempt: a retried row must not replay the same tokens.
                seed * 1000 + attempt,
            )
        _keep_routing(session, seqs, rows)
    finally:
        session.close()
    grouped = [seqs[k * n : (k + 1) * n] for k in range(len(prompts))]
    return Generation(grouped, version, counts)


def take_weights(session: DecodeSession, load: Callable[[], int], policy: UpdatePolicy) -> tuple[int, bool]:
    """Load new weights (`load`, which returns the version now loaded) between two
    decode steps of `session`, its running rows paused as `policy` says; returns that
    version and whether the rows go on in this session (False: they were aborted, and
    the caller starts them again).

    A session whose engine pauses itself (`take_weights(load, mode, clear_cache)`: vLLM's
    pause and resume, workers/inference/vllm_backend.py) does it. In the others nothing
    runs between two steps, so keeping the rows needs no pause, and an abort is closing
    the session, before the load (abort_resume continues the rows in a new session from
    their tokens: re-prefilled there under the new weights)."""
    own = getattr(session, "take_weights", None)
    if own is not None:
        return own(load, policy.pause_mode, policy.clear_cache)
    if policy.aborts:
        session.close()
    return load(), not policy.aborts


def _keep_routing(session, seqs: list[PartialSequence], rows: list[int]) -> None:
    """Each session row's recorded routing onto its sequence (nothing when not recorded)."""
    for r, i in enumerate(rows):
        routing = session.routing(r)
        if routing is not None:
            seqs[i].routing = routing
