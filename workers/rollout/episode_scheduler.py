"""Episodes of a multi-agent task, each on its own clock.

An episode is every turn of every agent of one interaction (workers/rl_tasks/propose_solve.py:
a proposer's turn, then a solver's). After each turn the agent's environment answers
with a wait of its own (`task.latency(agent)`, heavy-tailed on purpose), so episodes
end at very different times. `EpisodeScheduler` keeps many in flight at once: every
`step` runs one batched generate call for all the turns that are ready (whichever
agent, whichever episode) and hands back the groups whose every episode has ended. A
group (the `trainer.group_size` episodes of one prompt, GRPO's unit) holds one Rollout
per agent turn, each labelled with its agent; the trainer normalises advantages per
agent within the group (workers/train/trainer.py).

What the inference worker does with finished groups is `buffer.unit` (workers/run/inference_worker.py):
``group``, the batch barrier every surveyed library has (a call's groups go to the
buffer together once all of them have ended); ``episode``, each group as soon as it
ends, with `buffer.overcommit` more groups admitted than the batch needs, so the trainer
trains on those that end first and the late ones train a step later (their staleness
bounded by `buffer.max_staleness`, counted in buffer/late_groups).

Each ended episode leaves an `EpisodeTiming`: every agent's completion time (from the
moment its turn could start to its environment's answer: the queue for the batched call,
the generation and the wait) and the whole episode's, for the episode/* and agent/*
series.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.config.run_config import RunConfig
from workers.core.records import Group, Rollout, group_id
from workers.core.sampling_mask import SamplingMask
from workers.inference.base import Completion, InferenceBackend
from workers.model.tokenizer import Tokenizer
from workers.rl_tasks import Task
from workers.rollout.episode_timing import EpisodeTiming
from workers.rollout.episodes import (
    Episode,
    MultiAgentTask,
    MultiTurnTask,
    is_multi_agent,
    is_multi_turn,
    take_model_turn,
    turn_ender,
)
from workers.rollout.generation import encode_prompt, score_sequences
from workers.rollout.partial_rollouts import DRAIN, generate_across_updates


@dataclass
class _Episode:
    group: int  # key of its group in the scheduler
    prompt: str
    answer: str
    agent: int = 0  # multi-agent: index of the agent whose turn is next
    done: bool = False  # no turn left (its last environment may still be answering)
    ready_at: float = 0.0  # when the next turn may start (the environment answered)
    started: float = 0.0
    texts: dict[str, str] = field(default_factory=dict)
    rollouts: list[Rollout] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    seq: Episode | None = None  # multi-turn: the one sequence its turns build


@dataclass
class _Group:
    prompt: str
    answer: str
    group_id: str
    episodes: list[_Episode]


class EpisodeScheduler:
    """Episodes in flight, of a multi-agent task or of a multi-turn one (whose model
    turns and tool turns make one rollout per episode, workers/rollout/episodes.py, with no
    environment wait); `admit` starts groups, `step` advances them.

    `clock` is the wall clock; a test passes its own. Each generate call samples with a
    seed of its own (the latest admission's seed × 1000 + the calls made); which turns
    share a call depends on the environments' waits, so with waits a run is not repeated
    sample for sample."""

    def __init__(
        self,
        backend: InferenceBackend,
        task: Task,
        tokenizer: Tokenizer,
        cfg: RunConfig,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.task = task
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.rng = rng  # the environment's waits
        self.clock = clock
        # The task as one of the two kinds it is (it must be one: ValueError otherwise).
        self._turn_task: MultiTurnTask | None = task if is_multi_turn(task) else None
        self._agent_task: MultiAgentTask | None = task if is_multi_agent(task) else None
        if self._turn_task is None and self._agent_task is None:
            raise ValueError("EpisodeScheduler runs a multi-agent or a multi-turn task's episodes")
        self.multi_turn = self._turn_task is not None
        self._ends_turn = turn_ender(self._turn_task, tokenizer) if self._turn_task is not None else None
        self._groups: dict[int, _Group] = {}
        self._next_group = 0
        self._turns = 0  # turns generated, for their seeds
        self._seed = 0
        self.timings: list[EpisodeTiming] = []  # ended episodes' timings, drained by the worker
        self.tokens = 0  # tokens generated by the last `step`'s call

    @property
    def in_flight(self) -> int:
        """Groups admitted and not yet handed back."""
        return len(self._groups)

    def admit(self, prompts: list[tuple[str, str]], seed: int) -> None:
        """Start `trainer.group_size` episodes of each (prompt, answer); group ids are
        `"<seed>-<index>"` as for single-turn groups."""
        now = self.clock()
        self._seed = seed
        for i, (prompt, answer) in enumerate(prompts):
            key = self._next_group
            self._next_group += 1
            ids = encode_prompt(self.tokenizer, prompt, self.task) if self.multi_turn else []
            episodes = [
                _Episode(key, prompt, answer, ready_at=now, started=now, seq=Episode(list(ids)) if ids else None)
                for _ in range(self.cfg.trainer.group_size)
            ]
            self._groups[key] = _Group(prompt, answer, group_id(seed, i), episodes)

    def next_ready_in(self) -> float | None:
        """Seconds until something is due (0: now): the next turn may start, or an
        episode's last environment answers. None: nothing in flight."""
        if not self._groups:
            return None
        now = self.clock()
        if any(self._ended(g, now) for g in self._groups.values()):
            return 0.0
        due = [e.ready_at for g in self._groups.values() for e in g.episodes if not e.done or e.ready_at > now]
        return max(0.0, min(due) - now) if due else 0.0

    def step(self, version: int) -> list[Group]:
        """One batched generate call for every turn ready now (none: no call), then the
        groups whose every episode has ended, in the order they ended. The caller waits
        `next_ready_in` between steps (the environments' answers)."""
        self.tokens = 0
        now = self.clock()
        ready = [e for g in self._groups.values() for e in g.episodes if not e.done and e.ready_at <= now]
        if ready and self.multi_turn:
            self._model_turns(ready, version)
        elif ready:
            self._agent_turns(ready, version)
        return self._take_ended()

    def _model_turns(self, ready: list[_Episode], version: int) -> None:
        """A multi-turn task's next turn of each ready episode, cut at its tool call
        (workers/rollout/episodes.py); the tool answers at once."""
        task = self._turn_task
        assert task is not None
        budget = self.cfg.inference.max_new_tokens
        seqs = [e.seq for e in ready if e.seq is not None]
        gen = generate_across_updates(
            self.backend,
            [s.prompt_ids + s.token_ids for s in seqs],
            1,
            [budget - len(s.token_ids) for s in seqs],
            self.cfg.inference.temperature,
            self._seed * 1000 + self._turns,
            version,
            DRAIN,  # one version for the call: weights load between two calls (the loop)
            None,
            ends_turn=self._ends_turn,
        )
        self._turns += 1
        done = self.clock()
        for episode, seq, (turn,) in zip(ready, seqs, gen.sequences, strict=True):
            self.tokens += len(turn.token_ids)
            goes_on = take_model_turn(seq, turn, task, self.tokenizer, budget)
            episode.ready_at = done  # one agent: no per-agent times, the episode's own only
            episode.done = not goes_on

    def _agent_turns(self, ready: list[_Episode], version: int) -> None:
        task = self._agent_task
        assert task is not None
        agents = task.agents
        prompt_ids = [
            encode_prompt(self.tokenizer, task.agent_prompt(agents[e.agent], e.prompt, e.texts), task) for e in ready
        ]
        completions = self.backend.generate(
            prompt_ids,
            n=1,
            max_new_tokens=self.cfg.inference.max_new_tokens,
            temperature=self.cfg.inference.temperature,
            seed=self._seed * 1000 + self._turns,
        )
        self._turns += 1
        done = self.clock()
        for episode, ids, (c,) in zip(ready, prompt_ids, completions, strict=True):
            agent = agents[episode.agent]
            self.tokens += len(c.token_ids)
            episode.texts[agent] = self.tokenizer.decode(c.token_ids)
            episode.rollouts.append(_rollout(ids, c, version, agent))
            answered = done + task.latency(agent).draw(self.rng)
            episode.times[agent] = answered - episode.ready_at
            episode.ready_at = answered
            episode.agent += 1
            episode.done = episode.agent == len(agents)
            if episode.done:
                rewards = task.agent_rewards(episode.prompt, episode.answer, episode.texts)
                for r in episode.rollouts:
                    r.reward = float(rewards[r.agent])

    def _ended(self, group: _Group, now: float) -> bool:
        return all(e.done and e.ready_at <= now for e in group.episodes)

    def _take_ended(self) -> list[Group]:
        now = self.clock()
        ended = sorted(
            (k for k, g in self._groups.items() if self._ended(g, now)),
            key=lambda k: max(e.ready_at for e in self._groups[k].episodes),
        )
        out = []
        for k in ended:
            g = self._groups.pop(k)
            for e in g.episodes:
                self.timings.append(EpisodeTiming(dict(e.times), e.ready_at - e.started))
            if self.multi_turn:  # one rollout per episode, scored as any group of episodes
                (group,) = score_sequences(
                    self.task,
                    self.tokenizer,
                    [(g.prompt, g.answer)],
                    [[e.seq for e in g.episodes if e.seq is not None]],
                    self._seed,
                )
                rollouts = group.rollouts
            else:
                rollouts = [r for e in g.episodes for r in e.rollouts]
            for r in rollouts:
                r.group_id = g.group_id
            out.append(Group(group_id=g.group_id, prompt=g.prompt, answer=g.answer, rollouts=rollouts))
        return out

    def drain_timings(self) -> list[EpisodeTiming]:
        out, self.timings = self.timings, []
        return out


# Tests set this to "1": an inference worker scheduling by episode with `buffer.overcommit`
# hands its ended groups to the buffer in the order of the versions they were admitted at,
# and of the groups admitted at the version it holds, at most its share of the batch;
# the others (the overcommitted ones) wait until it holds a newer version, that is until
# the batch they were admitted for was taken. So every batch after the first starts with
# the groups the batch before left, each trained one version late. Whether an
# overcommitted episode ends after its batch, and before the next batch's episodes,
# otherwise depends on the drawn waits next to the trainer's speed; a test of the late
# groups sets it (through Ray's runtime_env) so that it holds whatever the host's load.
OVERCOMMIT_ENDS_LATE_ENV = "ROLLWAY_TEST_OVERCOMMIT_ENDS_LATE"


class LateOvercommit:
    """What OVERCOMMIT_ENDS_LATE_ENV makes an inference worker hand over of its ended
    groups: `admitted` is told each admission's groups and the version they were admitted
    at, `release` the groups that ended and the version the worker holds."""

    def __init__(self, share: int) -> None:
        self.share = share  # the worker's groups of one batch (its chunk)
        self._admitted_at: dict[str, int] = {}  # admitted and not handed over: in flight or held
        self._handed: Counter[int] = Counter()  # admission version → its groups handed while the worker held it
        self._held: list[Group] = []

    @classmethod
    def forced(cls, cfg: RunConfig, share: int) -> LateOvercommit | None:
        """The hook when this process runs under OVERCOMMIT_ENDS_LATE_ENV (None when not);
        ValueError naming the variable where the run overcommits nothing."""
        if os.environ.get(OVERCOMMIT_ENDS_LATE_ENV) != "1":
            return None
        if cfg.buffer.unit != "episode" or not cfg.buffer.overcommit:
            raise ValueError(
                f"{OVERCOMMIT_ENDS_LATE_ENV}=1 holds overcommitted episodes until their batch is taken, and this "
                f"run overcommits none (buffer.unit '{cfg.buffer.unit}', buffer.overcommit "
                f"{cfg.buffer.overcommit}): set buffer.unit 'episode' and buffer.overcommit above 0, or unset it"
            )
        return cls(share)

    def admitted(self, seed: int, n: int, version: int) -> None:
        """The `n` groups of the call seeded `seed` started at `version`."""
        for i in range(n):
            self._admitted_at[group_id(seed, i)] = version

    def release(self, ended: list[Group], version: int) -> list[Group]:
        """The groups to hand over now, of those held and `ended`, the rest held: a group
        admitted before `version` at once (its batch was taken: it is late); one admitted
        at `version` once no group admitted earlier is in flight or held, and only within
        the version's share."""
        self._held += ended
        self._held.sort(key=lambda g: self._admitted_at[g.group_id])  # stable: in the order they ended
        out, kept = [], []
        for g in self._held:
            at = self._admitted_at[g.group_id]
            earlier = any(v < at for v in self._admitted_at.values())
            if at < version or (not earlier and self._handed[at] < self.share):
                if at == version:
                    self._handed[at] += 1
                del self._admitted_at[g.group_id]
                out.append(g)
            else:
                kept.append(g)
        self._held = kept
        return out


def _rollout(prompt_ids: list[int], c: Completion, version: int, agent: str) -> Rollout:
    return Rollout(
        prompt_ids=list(prompt_ids),
        completion_ids=list(c.token_ids),
        behaviour_logprobs=list(c.logprobs),
        token_versions=list(c.versions) or [version] * len(c.token_ids),
        finish_reason=c.finish_reason or "length",
        expert_routing=c.routing,
        sampling_mask=SamplingMask.of(list(c.kept)),
        agent=agent,
    )
