"""The reward stage: a pool of reward workers between inference and the buffer.

    InferenceWorker ──(groups | chunks)──▶ RewardWorker ×rewards.workers ──scores──▶ InferenceWorker ─▶ buffer

With `rewards.workers` 0 nothing here runs: each inference worker scores its own groups
with the task's verifier (workers/rollout/generation.py). With a pool:

- `after`: an inference worker generates a batch, then hands each group to a reward
  worker and waits for the scores before it puts the groups into the buffer: the batch
  costs generation plus scoring, as in every library that scores after generation.
- `pipelined`: an inference worker generates one decode step at a time and, every
  `rewards.chunk_tokens` new tokens of a completion (or at each reasoning step, a line),
  sends the text so far to a reward worker without waiting (`ChunkStream`). The pool
  scores chunks while generation goes on; when the batch ends only the last chunks are
  left to score. A completion's reward is the score of its final chunk; each chunk
  ends a reasoning step, and its score is that step's (what `rewards.credit` "process"
  trains on: workers/train/loss.py `process_advantages`).

Scorers (`rewards.scorer`): `verifier`, the task's own reward (or `task.reward_funcs`)
on the text so far, with an optional cost per scored token standing in for a costly
verifier; `model`, a Hugging Face sequence- or token-classification reward model (a
process reward model: workers/rollout/prm.py makes a small one), its probability of "good" at
the last token of prompt + text so far.

Each reward worker holds a bundle of the run's placement group (workers/run/placement.py:
`rewards.cpus_per_worker`, `rewards.gpus_per_worker`, on nodes `placement.rewards_node`
names) and scores on the device Ray gave it (workers/core/devices.py).

Each reward worker reports how long it was busy scoring and, per scored chunk, the lag
from the generation of the chunk's last token to its score (`RewardReport`); the driver
turns them into reward/pool_busy_frac and reward/scoring_lag_ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from workers.config.run_config import RewardsConfig, RunConfig
from workers.core.run_actors import actor_class, where_am_i
from workers.core.watch import SCORE, Watch, WatchReport
from workers.rl_tasks import make_task
from workers.rl_tasks.reward_funcs import Scores, score_group
from workers.rollout.prm import last_token_scores, load_reward_model

# The series a run emits only with a reward pool (rewards.workers ≥ 1).
POOL_SERIES = frozenset({"reward/pool_busy_frac", "reward/scoring_lag_ms"})
# A reasoning step ends at a newline (countdown's and gsm8k's solutions write one
# equation or sentence per line).
STEP_END = "\n"


@dataclass
class RewardReport:
    """What a reward worker did since its last drain: seconds spent scoring, the window
    they fall in, and the lag (s) from each scored chunk's last generated token to its score."""

    busy_s: float
    t0: float
    t1: float
    lags_s: list[float] = field(default_factory=list)
    scored_at: list[float] = field(default_factory=list)  # when each of those scores was ready
    chunks: int = 0
    watch: WatchReport | None = None  # its calls open now and those closed (workers.core.watch)


def pool_metrics(reports: Sequence[RewardReport]) -> dict[str, float]:
    """reward/pool_busy_frac and reward/scoring_lag_ms over reports of the pool's
    workers (several drains each): busy seconds over worker-seconds of wall time, and
    the mean lag of the chunks scored (absent when none was)."""
    wall = sum(r.t1 - r.t0 for r in reports)
    out = {"reward/pool_busy_frac": min(1.0, sum(r.busy_s for r in reports) / wall) if wall > 0 else 0.0}
    lags = [lag for r in reports for lag in r.lags_s]
    if lags:
        out["reward/scoring_lag_ms"] = 1000 * sum(lags) / len(lags)
    return out


class VerifierScorer:
    """The task's reward on each text (the text so far, for a chunk), plus
    `cost_ms_per_token` of work per new token it scores."""

    def __init__(self, cfg: RunConfig) -> None:
        self.task = make_task(cfg.task)
        self.cost_s_per_token = cfg.rewards.verifier_cost_ms_per_token / 1000

    def score(self, prompt: str, answer: str, texts: list[str], ids: list[list[int]], new_tokens: int) -> Scores:
        if self.cost_s_per_token:
            # The worker's own time, as a reward model on a device of its own costs it
            # (spinning here would take the host's cores from the pools it stands beside).
            time.sleep(new_tokens * self.cost_s_per_token)
        return score_group(self.task, prompt, answer, texts, ids)


class ModelScorer:
    """A Hugging Face reward model: per text, the probability of its last label (the
    "good" one; a sigmoid for a one-logit head) at the last token of prompt + text. It
    computes on the device Ray gave its reward worker (rewards.gpus_per_worker), else
    the CPU."""

    def __init__(self, path: str) -> None:
        # Imported here: a reward worker that scores with functions never imports torch.
        from workers.core.devices import assigned_device

        model, self.tokenizer = load_reward_model(path)
        self.model = model.to(assigned_device())

    def score(self, prompt: str, answer: str, texts: list[str], ids: list[list[int]], new_tokens: int) -> Scores:
        totals = last_token_scores(self.model, self.tokenizer, [prompt + t for t in texts])
        return Scores(totals, [{} for _ in texts])


def make_scorer(cfg: RunConfig) -> VerifierScorer | ModelScorer:
    if cfg.rewards.scorer == "model":
        assert cfg.rewards.model_path is not None  # RewardsConfig requires it
        return ModelScorer(cfg.rewards.model_path)
    return VerifierScorer(cfg)


@actor_class(max_concurrency=4)
class RewardWorker:
    """Scores groups (`after`) or chunks (`pipelined`) one call at a time (a lock: one
    scorer, one device), while `drain_metrics` gets through."""

    def __init__(self, cfg: RunConfig, index: int) -> None:
        self.index = index
        self.scorer = make_scorer(cfg)
        self._lock = threading.Lock()  # held while scoring
        self._stats = threading.Lock()
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._since = time.time()
        self._lags: list[float] = []
        self._scored_at: list[float] = []
        self._chunks = 0
        self.watch = Watch()  # its calls, for the driver's watchdog

    def ready(self) -> bool:
        return True

    def where(self) -> dict:
        return where_am_i()

    def _scored(self, fn: Callable[[], Scores], t_generated: float, chunks: int) -> Scores:
        with self._lock, self.watch.op(SCORE):
            t0 = time.time()
            with self._stats:
                self._busy_since = t0
            try:
                return fn()
            finally:
                t1 = time.time()
                with self._stats:
                    self._busy_s += t1 - max(t0, self._since)
                    self._busy_since = None
                    self._lags.append(t1 - t_generated)
                    self._scored_at.append(t1)
                    self._chunks += chunks

    def score_group(
        self, prompt: str, answer: str, texts: list[str], ids: list[list[int]], t_generated: float
    ) -> Scores:
        """A whole group's rewards (`after`); the lag counts from `t_generated`, the end of
        the generate call that made it."""
        tokens = sum(len(i) for i in ids)
        return self._scored(
            lambda: self.scorer.score(prompt, answer, texts, ids, tokens), t_generated, chunks=len(texts)
        )

    def score_chunks(
        self, chunks: list[tuple[str, str, str, list[int], int]], t_generated: float
    ) -> list[tuple[float, dict[str, float | None]]]:
        """Completions' texts so far (`pipelined`), each (prompt, answer, text, token ids,
        tokens new since its previous chunk), the last generated at `t_generated`: each
        one's score and reward parts. One call per decode step and worker: a Ray call
        costs about as much as scoring a few tokens."""
        out = []
        for prompt, answer, text, ids, new_tokens in chunks:
            scores = self._scored(
                lambda: self.scorer.score(prompt, answer, [text], [ids], new_tokens),  # noqa: B023 (called at once)
                t_generated,
                chunks=1,
            )
            out.append((scores.totals[0], scores.parts[0]))
        return out

    def drain_metrics(self) -> RewardReport:
        with self._stats:
            now = time.time()
            busy = self._busy_s
            if self._busy_since is not None:  # the call in progress, up to now
                busy += now - max(self._busy_since, self._since)
                self._busy_since = now
            report = RewardReport(
                busy, self._since, now, self._lags, self._scored_at, self._chunks, watch=self.watch.drain()
            )
            self._busy_s, self._since, self._lags, self._scored_at, self._chunks = 0.0, now, [], [], 0
        return report


# -- the inference worker's side --------------------------------------------------------


class RewardPool:
    """An inference worker's handle on the reward workers. `on_wait(tokens)` is called
    once generation is done and the worker is about to wait for scores (its timeline
    closes the generate segment there)."""

    def __init__(self, workers: list, cfg: RewardsConfig, offset: int = 0) -> None:
        self.workers = workers
        self.cfg = cfg
        self.offset = offset  # spreads inference workers over the pool
        self.on_wait: Callable[[int], None] = lambda tokens: None

    @property
    def pipelined(self) -> bool:
        return self.cfg.mode == "pipelined"

    def worker(self, k: int):
        return self.workers[(self.offset + k) % len(self.workers)]

    def score_after(
        self, prompts: Sequence[tuple[str, str]], texts: list[list[str]], ids: list[list[list[int]]]
    ) -> list[Scores]:
        """Each group's scores, one group per reward worker in turn, after generation."""
        t_generated = time.time()
        self.on_wait(sum(len(i) for group in ids for i in group))
        refs = [
            self.worker(k).score_group.remote(p, a, t, i, t_generated)
            for k, ((p, a), t, i) in enumerate(zip(prompts, texts, ids, strict=True))
        ]
        return ray.get(refs)

    def stream(self, prompts: Sequence[tuple[str, str]], n: int, decode: Callable[[list[int]], str]) -> ChunkStream:
        return ChunkStream(self, prompts, n, decode)


class ChunkStream:
    """One generate call's completions, streamed to the pool as they grow.

    `on_step(seqs)` runs after each decode step (seqs prompt-major, `n` per prompt) and
    sends each completion's text so far when it has grown `chunk_tokens` tokens (0: when
    its new tokens hold a step end) or finished; `scores()` waits for the last chunks and
    returns each group's scores (a completion's reward: its final chunk's score), and
    leaves every completion's steps in `step_ends` (the tokens it had at each chunk) and
    `step_scores` (each chunk's score, the final one last)."""

    def __init__(
        self, pool: RewardPool, prompts: Sequence[tuple[str, str]], n: int, decode: Callable[[list[int]], str]
    ) -> None:
        self.pool, self.prompts, self.n, self.decode = pool, list(prompts), n, decode
        self.sent: dict[int, int] = {}  # completion → tokens it had at its last chunk
        # completion → (call, place in it) of its final chunk's score / of its earlier chunks'
        self.finals: dict[int, tuple[Any, int]] = {}
        self.steps: dict[int, list[tuple[Any, int]]] = {}
        self.ends: dict[int, list[int]] = {}  # completion → tokens it had at each chunk, the final one's too
        self.step_ends: list[list[int]] = []
        self.step_scores: list[list[float]] = []

    def on_step(self, seqs: Sequence) -> None:
        due: dict[int, list[tuple[int, bool]]] = {}  # reward worker → [(completion, final)]
        for i, s in enumerate(seqs):
            if i in self.finals:
                continue
            have, sent = len(s.token_ids), self.sent.get(i, 0)
            if have < sent:  # abort_retry restarted it
                self.sent[i], self.steps[i], self.ends[i] = 0, [], []
                sent = 0
            final = s.finish_reason is not None
            if final or (have > sent and self._chunk_due(s.token_ids[sent:])):
                due.setdefault(i % len(self.pool.workers), []).append((i, final))
        self._send(seqs, due)

    def _chunk_due(self, new: list[int]) -> bool:
        k = self.pool.cfg.chunk_tokens
        if k:
            return len(new) >= k
        return STEP_END in self.decode(new[-1:])

    def _send(self, seqs: Sequence, due: dict[int, list[tuple[int, bool]]]) -> None:
        """One call per reward worker with the chunks due on it."""
        now = time.time()
        for k, items in due.items():
            chunks = []
            for i, _ in items:
                prompt, answer = self.prompts[i // self.n]
                ids = list(seqs[i].token_ids)
                chunks.append((prompt, answer, self.decode(ids), ids, len(ids) - self.sent.get(i, 0)))
                self.sent[i] = len(ids)
                self.ends.setdefault(i, []).append(len(ids))
            ref = self.pool.worker(k).score_chunks.remote(chunks, now)
            for j, (i, final) in enumerate(items):
                if final:
                    self.finals[i] = (ref, j)
                else:
                    self.steps.setdefault(i, []).append((ref, j))

    def scores(self, seqs: Sequence) -> list[Scores]:
        """After the last decode step: each group's scores, once its last chunks are scored."""
        self.on_step(seqs)
        left: dict[int, list[tuple[int, bool]]] = {}  # sequences a stepped mode left unfinished
        for i in range(len(seqs)):
            if i not in self.finals:
                left.setdefault(i % len(self.pool.workers), []).append((i, True))
        self._send(seqs, left)
        self.pool.on_wait(sum(len(s.token_ids) for s in seqs))
        calls = {ref: None for ref, _ in [*self.finals.values(), *(c for v in self.steps.values() for c in v)]}
        results = dict(zip(calls, ray.get(list(calls)), strict=True))
        finals = [results[ref][j] for ref, j in (self.finals[i] for i in range(len(seqs)))]
        self.step_ends, self.step_scores = [], []
        for i, final in enumerate(finals):
            ends = self.ends[i]
            scores = [results[ref][j][0] for ref, j in self.steps.get(i, [])] + [final[0]]
            if len(ends) > 1 and ends[-1] == ends[-2]:
                # The final chunk repeats the text of the step before it (a sequence a
                # stepped mode left unfinished): one step, scored by the final chunk.
                del ends[-2], scores[-2]
            self.step_ends.append(ends)
            self.step_scores.append(scores)
        out = []
        for g in range(len(seqs) // self.n):
            part = finals[g * self.n : (g + 1) * self.n]
            out.append(Scores([t for t, _ in part], [p for _, p in part]))
        return out
