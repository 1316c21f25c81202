"""Multi-turn episodes on the real torch backend: a tiny Llama taught the calculator
protocol by a short supervised warm start (demonstrations, tool turns masked: ~150
steps, seconds) calls the tool, the environment's results are appended, and a new
version loaded between two turns produces the later turn, with that version's logprobs.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.engine.helpers import small_config
from workers.config.run_config import ModelConfig
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import build_tiny, load_model, save_model
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks.tool_task import CalculatorTask
from workers.rollout.generation import generate, generate_groups
from workers.rollout.partial_rollouts import UpdatePolicy
from workers.train.trainer import pack, spread, token_logprobs

TOK = CharTokenizer()
TASK = CalculatorTask(max_operand=9, max_terms=2)
MAX_NEW = 32


def turns(rollout) -> list[tuple[list[int], int]]:
    """A rollout's completion as (token ids, mask) runs: its turns, in order."""
    out: list[tuple[list[int], int]] = []
    for token, m in zip(rollout.completion_ids, rollout.loss_mask, strict=True):
        if out and out[-1][1] == m:
            out[-1][0].append(token)
        else:
            out.append(([token], m))
    return out


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory) -> str:
    """A tiny Llama after supervised steps on the task's demonstrations, the tool's
    turns masked out of the loss as RL masks them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), TOK, seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        rng = random.Random(0)
        for _ in range(150):
            pairs = TASK.sample(32, rng)
            completions, masks = [], []
            for prompt, answer in pairs:
                ids, mask = [], []
                for text, is_model in TASK.demonstration_turns(prompt, answer):
                    encoded = TOK.encode(text)
                    ids += encoded
                    mask += [int(is_model)] * len(encoded)
                completions.append([*ids, TOK.eos_id])
                masks.append([*mask, 1])
            batch = pack([TOK.prompt_ids(p) for p, _ in pairs], completions, TOK.pad_id)
            weight = spread(masks, batch)
            loss = -(token_logprobs(model, batch, 1.0) * weight).sum() / weight.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(before)
    path = str(tmp_path_factory.mktemp("tool-model"))
    save_model(model.eval(), TOK, path)
    return path


def test_the_torch_backend_runs_episodes_that_call_the_tool(tool_model_dir, one_torch_thread):
    cfg = small_config(inference={"max_new_tokens": MAX_NEW}, trainer={"group_size": 4})
    prompts = TASK.sample(6, random.Random(1))
    groups = generate_groups(TorchBackend(tool_model_dir), TASK, TOK, prompts, cfg, 2, seed=5)
    rollouts = [r for g in groups for r in g.rollouts]
    calls = 0
    for g in groups:
        for r in g.rollouts:
            assert len(r.completion_ids) == len(r.loss_mask) == len(r.behaviour_logprobs) == len(r.token_versions)
            assert len(r.completion_ids) <= MAX_NEW and set(r.token_versions) == {2}
            runs = turns(r)
            assert runs[0][1] == 1  # the model speaks first
            for (model_ids, _), (tool_ids, tool_mask) in zip(runs[::2], runs[1::2], strict=False):
                # Each environment turn is exactly the calculator's answer to the call before it.
                call = TASK.find_call(TOK.decode(model_ids))
                assert tool_mask == 0 and call is not None
                expected = TOK.encode(TASK.run_tool(call))
                assert tool_ids == expected[: len(tool_ids)]
                calls += 1
            assert r.reward == TASK.reward(TOK.decode(r.completion_ids), g.answer)
    # Measured: all 24 episodes call the tool once, and 23 of 24 answer right.
    assert calls >= len(rollouts) // 2
    assert sum(r.reward for r in rollouts) >= len(rollouts) // 2


class Recording:
    """The real backend, counting its sessions (one per turn) and whether each closed."""

    def __init__(self, backend: TorchBackend) -> None:
        self.backend = backend
        self.closed: list[bool] = []

    def start(self, prompts, max_new_tokens, temperature, seed, n=1):
        session = self.backend.start(prompts, max_new_tokens, temperature, seed, n=n)
        index = len(self.closed)
        self.closed.append(False)
        close = session.close

        def closing() -> None:
            self.closed[index] = True
            close()

        session.close = closing
        return session


@pytest.mark.parametrize("mode", ["in_flight", "abort_resume", "abort_retry"])
def test_a_version_loaded_between_turns_produces_the_later_turn(tool_model_dir, one_torch_thread, mode):
    """Version 1 (the policy plus noise) is staged while turn 1 runs and loaded once it
    ends: turn 1 and its tool result carry version 0, the answer turn version 1, and each
    turn's logprobs are those of its own version's weights (a full forward of each)."""
    old = load_model(tool_model_dir).state_dict()
    gen = torch.Generator().manual_seed(3)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in old.items()}
    backend = Recording(TorchBackend(tool_model_dir))

    class Updates:
        applied = False

        def pending(self) -> bool:
            return not self.applied and bool(backend.closed) and backend.closed[0]

        def apply(self) -> int:
            self.applied = True
            backend.backend.load_weights(new)
            return 1

    cfg = small_config(inference={"max_new_tokens": MAX_NEW}, trainer={"group_size": 2}, sync={"update_mode": mode})
    prompts = TASK.sample(3, random.Random(2))
    out = generate(backend, TASK, TOK, prompts, cfg, 0, 9, UpdatePolicy.of(cfg), Updates())
    groups, version, counts = out.groups, out.version, out.counts
    assert version == 1 and counts.mid_generation_updates == 1 and counts.aborted == 0

    references = {}
    for name, weights in (("old", old), ("new", new)):
        model = load_model(tool_model_dir)
        model.load_state_dict(weights)
        references[name] = model.eval()

    later_turns = 0
    for r in (r for g in groups for r in g.rollouts):
        runs = turns(r)
        assert r.token_versions[: len(runs[0][0])] == [0] * len(runs[0][0])  # turn 1
        if len(runs) < 3:
            continue  # ended in its first turn (or on the tool's result): nothing later
        later_turns += 1
        first, tool, rest = len(runs[0][0]), len(runs[1][0]), len(r.completion_ids) - len(runs[0][0]) - len(runs[1][0])
        assert r.token_versions == [0] * first + [0] * tool + [1] * rest
        assert r.min_version == 0
        batch = pack([r.prompt_ids], [r.completion_ids], TOK.pad_id)
        with torch.no_grad():
            want = {k: spread_back(token_logprobs(m, batch, 1.0), batch) for k, m in references.items()}
        got = torch.tensor(r.behaviour_logprobs)
        torch.testing.assert_close(got[:first], want["old"][:first], atol=1e-4, rtol=0)
        torch.testing.assert_close(got[first + tool :], want["new"][first + tool :], atol=1e-4, rtol=0)
        # ...and not the other version's: the check can tell them apart.
        assert not torch.allclose(got[first + tool :], want["old"][first + tool :], atol=1e-4, rtol=0)
    assert later_turns >= 3  # measured: all 6 episodes reach their answer turn


def spread_back(values: torch.Tensor, batch) -> torch.Tensor:
    """The completion's per-token values out of the packed (1, T-1) layout."""
    return values[batch.mask]


def test_the_episode_scheduler_runs_calculator_episodes_each_on_its_own_clock(tool_model_dir, one_torch_thread):
    from workers.rollout.episode_scheduler import EpisodeScheduler

    cfg = small_config(
        task={"name": "calculator"},
        buffer={"unit": "episode"},
        inference={"max_new_tokens": MAX_NEW},
        trainer={"group_size": 4},
    )
    sched = EpisodeScheduler(TorchBackend(tool_model_dir), TASK, TOK, cfg, random.Random(0))
    sched.admit(TASK.sample(3, random.Random(1)), seed=5)
    groups = []
    while sched.in_flight:
        groups += sched.step(version=2)
    assert sorted(g.group_id for g in groups) == ["5-0", "5-1", "5-2"]
    calls = 0
    for g in groups:
        assert len(g.rollouts) == 4 and all(r.group_id == g.group_id and r.agent == "" for r in g.rollouts)
        for r in g.rollouts:
            assert len(r.completion_ids) == len(r.loss_mask) <= MAX_NEW and set(r.token_versions) == {2}
            runs = turns(r)
            for (model_ids, _), (tool_ids, tool_mask) in zip(runs[::2], runs[1::2], strict=False):
                call = TASK.find_call(TOK.decode(model_ids))
                assert tool_mask == 0 and call is not None
                assert tool_ids == TOK.encode(TASK.run_tool(call))[: len(tool_ids)]
                calls += 1
            assert r.reward == TASK.reward(TOK.decode(r.completion_ids), g.answer)
    timings = sched.drain_timings()
    assert len(timings) == 12 and all(t.agents == {} and t.total_s > 0 for t in timings)
    rollouts = [r for g in groups for r in g.rollouts]
    assert calls >= len(rollouts) // 2 and sum(r.reward for r in rollouts) >= len(rollouts) // 2
