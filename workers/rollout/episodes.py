"""Multi-turn episodes: the model and a tool environment take turns within one rollout.

A turn of the model is generated until it makes a tool call (the task recognises one in
the turn's text: `find_call`), or until EOS or the token budget. A call is run by the
task (`run_tool`); its text, encoded with the run's tokenizer, is appended as the
environment's turn (or, for a task with `tools` whose JSON schemas the model's chat
template renders, its `tool_output` as a `tool` message of that template: `task_tools`),
and the model continues from the extended context. An episode ends at EOS, when its
`max_new_tokens` budget (model and tool tokens together) is spent, or when a turn
makes a call with no turn left (`max_turns` model turns; finish_reason "length" for
both limits).

Each episode becomes one Rollout (workers/core/records.py): model and tool tokens interleaved
in `completion_ids`, `loss_mask` 0 on tool tokens, whose behaviour logprob is a
placeholder 0.0 and whose version is that of the call they answer.

Versions: every model token carries the version of the weights that produced it. With
`sync.update_mode` drain the whole batch of episodes runs on the weights it started
with. With the stepped modes (workers/rollout/partial_rollouts.py), weights staged meanwhile are loaded
between two turns (nothing is generating then, so nothing is aborted), and within a
turn as the mode says; abort_retry regenerates only the aborted turn, keeping the
finished turns before it, whose tool results depend on them. Later turns thus carry
newer versions than earlier ones.

A task asks for episodes with `multi_turn = True` (`is_multi_turn`); one whose agents take
turns, one policy playing them all, with `multi_agent = True` (`is_multi_agent`: the
episode scheduler, workers/rollout/episode_scheduler.py, runs those).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

from workers.core.latency import Latency
from workers.inference.base import InferenceBackend
from workers.model.tokenizer import Tokenizer
from workers.rl_tasks import Task
from workers.rollout.partial_rollouts import (
    DRAIN,
    Generation,
    PartialCounts,
    PartialSequence,
    UpdatePolicy,
    WeightUpdates,
    generate_across_updates,
)

# The behaviour logprob a tool token carries: the policy never sampled it. Never read.
TOOL_LOGPROB = 0.0


class MultiTurnTask(Task, Protocol):
    """A task whose rollouts are episodes with a tool (workers/rl_tasks/tool_task.py)."""

    multi_turn: bool  # True
    max_turns: int  # model turns per episode, the final answer's included

    def find_call(self, turn_text: str) -> str | None:
        """The call a model turn's text (so far) ends with, or None."""
        ...

    def run_tool(self, call: str) -> str:
        """The environment's turn answering `call` (text; never raises)."""
        ...

    def tool_output(self, call: str) -> str:
        """The tool's answer alone, a `tool` message's content (a task with `tools`)."""
        ...


def task_tools(task: object, tokenizer: Tokenizer) -> list[dict] | None:
    """The JSON schemas of a multi-turn task's tools where the tokenizer's chat template
    renders them (the model then sees the format it was trained on), else None: the
    task's own text format."""
    tools = getattr(task, "tools", None) if is_multi_turn(task) else None
    return tools if tools and tokenizer.renders_tools(tools) else None


def tool_turn_ids(task: MultiTurnTask, tokenizer: Tokenizer, call: str) -> list[int]:
    """The environment's turn answering `call`: the tool's output as a `tool` message of
    the chat template (`task_tools`), after the end-of-turn token the model wrote itself
    (not repeated), or the task's own text."""
    tools = task_tools(task, tokenizer)
    if tools is None:
        return tokenizer.encode(task.run_tool(call))
    ids = tokenizer.tool_result_ids(task.tool_output(call), tools)
    return ids[1:] if ids and ids[0] in tokenizer.stop_ids else ids


def episode_text(tokenizer: Tokenizer, token_ids: list[int], loss_mask: list[int]) -> str:
    """An episode as the reward reads it: each model turn decoded as a completion (up to
    its stop id), each tool turn whole. A chat template's tool turn holds the model's
    end-of-turn token, which is a stop id: decoding the episode at once would end there."""
    stops = set(tokenizer.stop_ids)
    text, k = [], 0
    while k < len(token_ids):
        end = k
        while end < len(token_ids) and loss_mask[end] == loss_mask[k]:
            end += 1
        run = token_ids[k:end]
        if loss_mask[k]:
            text.append(tokenizer.decode(run))
        else:  # decoded between its stop ids, which are special tokens a decode leaves out
            piece: list[int] = []
            for i in [*run, None]:
                if i is None or i in stops:
                    text.append(tokenizer.decode(piece))
                    piece = []
                else:
                    piece.append(i)
        k = end
    return "".join(text)


def is_multi_turn(task: object) -> TypeGuard[MultiTurnTask]:
    """Whether `task` asks for episodes (a `multi_turn = True` attribute) rather than
    single completions."""
    return bool(getattr(task, "multi_turn", False))


class MultiAgentTask(Task, Protocol):
    """A task whose episodes take turns between several agents (one policy plays them all)."""

    multi_agent: bool  # True
    agents: tuple[str, ...]  # in turn order; each takes one turn per episode

    def agent_prompt(self, agent: str, prompt: str, texts: dict[str, str]) -> str:
        """What `agent` is given, after the earlier agents wrote `texts`."""
        ...

    def agent_rewards(self, prompt: str, answer: str, texts: dict[str, str]) -> dict[str, float]:
        """Each agent's reward for one ended episode."""
        ...

    def latency(self, agent: str) -> Latency:
        """How long `agent`'s environment takes to answer its turn."""
        ...


def is_multi_agent(task: object) -> TypeGuard[MultiAgentTask]:
    """Whether `task` runs episodes of several agents (a `multi_agent = True` attribute)."""
    return bool(getattr(task, "multi_agent", False))


@dataclass
class Episode(PartialSequence):
    """One episode being built: `token_ids` holds model and tool tokens in order, with
    `loss_mask` 1 on the model's and 0 on the tool's."""

    loss_mask: list[int] = field(default_factory=list)
    turns: int = 0  # model turns taken
    tool_calls: int = 0

    def add_model_turn(self, turn: PartialSequence) -> None:
        self.token_ids += turn.token_ids
        self.logprobs += turn.logprobs
        self.versions += turn.versions
        self.kept += turn.kept
        self.loss_mask += [1] * len(turn.token_ids)
        self.turns += 1
        # The turn's session ran the whole episode so far as its prompt: its record covers
        # every earlier token as well (tokens it ran past the turn's end are cut at training).
        if turn.routing is not None:
            self.routing = turn.routing

    def add_tool_turn(self, ids: list[int], version: int) -> None:
        self.token_ids += ids
        self.logprobs += [TOOL_LOGPROB] * len(ids)
        self.versions += [version] * len(ids)
        self.kept += [None] * len(ids)  # the environment's: never sampled
        self.loss_mask += [0] * len(ids)
        self.tool_calls += 1


def run_episodes(
    backend: InferenceBackend,
    task: MultiTurnTask,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    version: int,
    policy: UpdatePolicy = DRAIN,
    updates: WeightUpdates | None = None,
) -> Generation:
    """`n` episodes per prompt (prompt-major, grouped per prompt as in
    workers.rollout.partial_rollouts.Generation), the version loaded at the end, and the partial counts.

    Under drain (or no `updates`): one version throughout. A stepped `policy` with
    `updates`: new weights are taken between turns and within turns as it says.
    Turns are generated one decode step at a time whatever the policy, since a turn must
    stop at its call, which only a per-step check sees.
    """
    if task.max_turns < 1:
        raise ValueError(f"max_turns must be ≥ 1 (got {task.max_turns})")
    weights = policy.offered(updates)

    ends_turn = turn_ender(task, tokenizer)

    episodes = [Episode(list(p)) for p in prompts for _ in range(n)]
    counts = PartialCounts()
    live = list(range(len(episodes)))
    while live:
        turn = episodes[live[0]].turns  # every live episode has taken as many turns
        if turn > 0 and weights.pending():
            version = weights.apply()
            counts.mid_generation_updates += 1
        gen = generate_across_updates(
            backend,
            [episodes[i].prompt_ids + episodes[i].token_ids for i in live],
            1,
            [max_new_tokens - len(episodes[i].token_ids) for i in live],
            temperature,
            # The first turn samples as a single-turn call would; later turns get streams
            # of their own (distinct from the abort retries' seed * 1000 + attempt).
            seed if turn == 0 else seed * 1000 + 500 + turn,
            version,
            policy,
            weights,
            ends_turn=ends_turn,
        )
        version = gen.version
        counts.add(gen.counts)
        still = []
        for i, (model_turn,) in zip(live, gen.sequences, strict=True):
            if take_model_turn(episodes[i], model_turn, task, tokenizer, max_new_tokens):
                still.append(i)
        live = still
    grouped = [episodes[k * n : (k + 1) * n] for k in range(len(prompts))]
    return Generation(grouped, version, counts)


def turn_ender(task: MultiTurnTask, tokenizer: Tokenizer) -> Callable[[PartialSequence], bool]:
    """`generate_across_updates`' `ends_turn` for `task`: in the text format a turn is cut
    where its call ends; in the chat template's format (`task_tools`) a model closes its
    turn itself after a call (its end-of-turn token, a stop id), as it was trained to, so
    nothing is cut and the call is read from the finished turn."""
    tools = task_tools(task, tokenizer)

    def ends_turn(turn: PartialSequence) -> bool:
        return tools is None and task.find_call(tokenizer.decode(turn.token_ids)) is not None

    return ends_turn


def take_model_turn(
    episode: Episode, model_turn: PartialSequence, task: MultiTurnTask, tokenizer: Tokenizer, max_new_tokens: int
) -> bool:
    """Add a generated turn to `episode` and, where it made a call, the tool's answer;
    True while the episode goes on (a call answered with budget and turns left), else
    the episode has its finish_reason."""
    episode.add_model_turn(model_turn)
    tools = task_tools(task, tokenizer)
    called = model_turn.finish_reason == "turn" or (
        tools is not None
        and model_turn.finish_reason == "stop"
        and task.find_call(tokenizer.decode(model_turn.token_ids)) is not None
    )
    if not called:  # EOS without a call, or the budget spent
        episode.finish_reason = model_turn.finish_reason or "length"
        return False
    if episode.turns >= task.max_turns:  # a call with no turn left to answer
        episode.finish_reason = "length"
        return False
    call = task.find_call(tokenizer.decode(model_turn.token_ids))
    if call is None:  # `called` found it in these very tokens
        raise RuntimeError("a turn that ended at a tool call has no call")
    ids = tool_turn_ids(task, tokenizer, call)
    room = max_new_tokens - len(episode.token_ids)
    episode.add_tool_turn(ids[:room], model_turn.versions[-1])
    if len(ids) >= room:
        episode.finish_reason = "length"
        return False
    return True
