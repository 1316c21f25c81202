"""Multi-agent episodes: the heavy-tailed environment, the two-role task, the scheduler that
runs episodes on their own clocks, per-agent advantages, the buffer's overcommit and late
groups, and the configs refused at launch. No Ray, no model: a scripted backend and a
clock the test moves.
"""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from workers.config.run_config import RunConfig
from workers.core.latency import Latency
from workers.core.records import Group, Rollout, group_id
from workers.inference.base import Completion
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rl_tasks.propose_solve import ProposeSolveTask, problem_value
from workers.rollout.episode_scheduler import OVERCOMMIT_ENDS_LATE_ENV, EpisodeScheduler, LateOvercommit
from workers.rollout.episode_timing import EpisodeTiming, timing_metrics
from workers.rollout.episodes import is_multi_agent
from workers.run.buffer import AdmissionGate, RolloutBuffer, plan
from workers.run.runnable import check_runnable
from workers.train.batch_stats import batch_metrics
from workers.train.loss import scaled_advantages
from workers.train.trainer import agent_advantages

# -- the environment's latency --------------------------------------------------------


@pytest.mark.parametrize(("median", "ratio"), [(0.5, 5.0), (2.0, 1.5), (0.1, 20.0)])
def test_latency_draws_have_the_median_and_p90_ratio_asked(median, ratio):
    lat = Latency(median, ratio)
    rng = random.Random(7)
    draws = sorted(lat.draw(rng) for _ in range(40_000))
    p50, p90 = draws[len(draws) // 2], draws[int(0.9 * len(draws))]
    assert p50 == pytest.approx(median, rel=0.04)
    assert p90 / p50 == pytest.approx(ratio, rel=0.05)
    assert lat.quantile(0.9) == pytest.approx(median * ratio)


def test_latency_without_a_median_or_a_tail_is_constant():
    rng = random.Random(0)
    assert {Latency(0.0, 5.0).draw(rng) for _ in range(10)} == {0.0}
    assert {Latency(0.3, 1.0).draw(rng) for _ in range(10)} == {0.3}


@pytest.mark.parametrize(("median", "ratio", "field"), [(-1, 2, "median_s"), (1, 0.5, "p90_ratio")])
def test_latency_refuses_what_is_no_distribution(median, ratio, field):
    with pytest.raises(ValueError, match=field):
        Latency(median, ratio)


# -- the two-role task ------------------------------------------------------------------


def test_propose_solve_rewards_each_role_for_its_own_job():
    task = ProposeSolveTask()
    prompt, answer = "pose 3 5:", "3 5"
    assert task.agent_rewards(prompt, answer, {"proposer": "3*5", "solver": "15"}) == {"proposer": 1.0, "solver": 1.0}
    assert task.agent_rewards(prompt, answer, {"proposer": "3+5", "solver": "15"}) == {"proposer": 1.0, "solver": 0.0}
    # Not the given numbers, one unused, a negative value, a fraction: nothing to solve.
    for problem, value in (("3*4", "12"), ("3", "3"), ("3-5", "-2"), ("3/5", "3/5")):
        assert task.agent_rewards(prompt, answer, {"proposer": problem, "solver": value}) == {
            "proposer": 0.0,
            "solver": 0.0,
        }
    assert task.agent_prompt("proposer", prompt, {}) == prompt
    assert task.agent_prompt("solver", prompt, {"proposer": " 3*5 "}) == "3*5="
    assert task.reward("5+3", answer) == 1.0 and task.reward("5+5", answer) == 0.0


def test_propose_solve_samples_and_teaches_both_roles():
    task = make_task(RunConfig.model_validate({"task": {"name": "propose_solve", "options": {"count": 3}}}).task)
    assert is_multi_agent(task) and task.agents == ("proposer", "solver")
    for prompt, answer in task.sample(50, random.Random(1)):
        (p1, problem), (p2, value) = task.role_demonstrations(prompt, answer)
        assert p1 == prompt and p2 == problem + "="
        assert task.agent_rewards(prompt, answer, {"proposer": problem, "solver": value}) == {
            "proposer": 1.0,
            "solver": 1.0,
        }
        assert problem_value(problem, [int(n) for n in answer.split()]) == int(value)


# -- the scheduler ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class ScriptedBackend:
    """Answers a proposer prompt with "<a>+<b>" of its numbers and a solver prompt with
    `solve(problem)`; advances the clock by `gen_s` per call and records each call's prompts."""

    def __init__(self, tok: CharTokenizer, clock: Clock, gen_s: float = 0.01, solve=None) -> None:
        self.tok, self.clock, self.gen_s = tok, clock, gen_s
        self.solve = solve or (lambda problem: str(problem_value(problem, [int(c) for c in problem if c.isdigit()])))
        self.calls: list[list[str]] = []

    def generate(self, prompts, n, max_new_tokens, temperature, seed):
        assert n == 1
        texts = [self.tok.decode(p[1:]) for p in prompts]
        self.calls.append(texts)
        self.clock.t += self.gen_s
        out = []
        for text in texts:
            if text.startswith("pose "):
                a, b = text[len("pose ") : -1].split()
                answer = f"{a}+{b}"
            else:
                answer = self.solve(text[:-1])
            ids = self.tok.encode(answer)
            out.append([Completion(ids, [-0.5] * len(ids), "stop")])
        return out


class FixedLatencyTask(ProposeSolveTask):
    """propose_solve whose environments answer after waits read from `waits`, in order."""

    def __init__(self, waits: list[float]) -> None:
        super().__init__()
        self.waits = iter(waits)

    def latency(self, agent):
        return Latency(next(self.waits), 1.0)


def scheduler(task, group_size=2, gen_s=0.01, solve=None):
    cfg = RunConfig.model_validate(
        {"task": {"name": "propose_solve"}, "trainer": {"batch_groups": 2, "group_size": group_size}}
    )
    clock = Clock()
    tok = CharTokenizer()
    backend = ScriptedBackend(tok, clock, gen_s, solve)
    return EpisodeScheduler(backend, task, tok, cfg, random.Random(0), clock=clock), clock, backend


def run_to_end(sched, clock) -> list[tuple[float, Group]]:
    out = []
    while sched.in_flight:
        due = sched.next_ready_in()
        clock.t += due
        out += [(clock.t, g) for g in sched.step(version=3)]
    return out


def test_a_group_is_handed_back_when_its_last_episode_ends_and_groups_in_the_order_they_end():
    # Two groups of two episodes; waits are drawn per turn in call order: the first call
    # runs the four proposer turns (group 0's two episodes, then group 1's).
    waits = [0.5, 0.1, 0.1, 0.1]  # proposer turns: g0e0 slow, the rest fast
    sched, clock, backend = scheduler(FixedLatencyTask(waits + [0.1] * 4))
    sched.admit([("pose 1 2:", "1 2"), ("pose 3 4:", "3 4")], seed=9)
    assert sched.in_flight == 2
    ended = run_to_end(sched, clock)
    assert [g.group_id for _, g in ended] == ["9-1", "9-0"]  # group 1 never waited on group 0's straggler
    assert backend.calls[0] == ["pose 1 2:"] * 2 + ["pose 3 4:"] * 2
    assert backend.calls[1] == ["1+2="] + ["3+4="] * 2  # the three fast ones, batched in one call
    assert backend.calls[2] == ["1+2="]  # the straggler's solver, on its own
    group1 = ended[0][1]
    assert [r.agent for r in group1.rollouts] == ["proposer", "solver"] * 2
    assert all(r.group_id == "9-1" and r.token_versions == [3] * len(r.completion_ids) for r in group1.rollouts)
    assert [r.reward for r in group1.rollouts] == [1.0, 1.0, 1.0, 1.0]
    assert sched.in_flight == 0 and sched.next_ready_in() is None


def test_each_agents_time_counts_its_queue_generation_and_environment():
    sched, clock, _ = scheduler(FixedLatencyTask([0.2, 0.2, 0.7, 0.7]), gen_s=0.05)
    sched.admit([("pose 1 2:", "1 2")], seed=1)
    run_to_end(sched, clock)
    timings = sched.drain_timings()
    # Proposers: one call of 0.05 s, then 0.2 s. Solvers: one call at 100.25 (0.05), then 0.7.
    assert [t.agents["proposer"] for t in timings] == pytest.approx([0.25, 0.25])
    assert [t.agents["solver"] for t in timings] == pytest.approx([0.75, 0.75])
    assert [t.total_s for t in timings] == pytest.approx([1.0, 1.0])
    assert sched.drain_timings() == []


def test_the_solver_is_rewarded_per_episode_and_a_wrong_answer_scores_zero():
    sched, clock, _ = scheduler(ProposeSolveTask(), solve=lambda problem: "0")
    sched.admit([("pose 1 2:", "1 2")], seed=0)
    ((_, group),) = run_to_end(sched, clock)
    assert {(r.agent, r.reward) for r in group.rollouts} == {("proposer", 1.0), ("solver", 0.0)}


def test_timing_metrics_are_the_percentiles_of_the_episodes_and_of_each_agent():
    timings = [EpisodeTiming({"proposer": p, "solver": s}, p + s) for p, s in [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]]
    m = timing_metrics(timings)
    assert m["episode/p50_s"] == 9.0 and m["episode/p90_s"] == pytest.approx(13.8)
    assert m["episode/tail_ratio"] == pytest.approx(13.8 / 9.0)
    assert m["agent/proposer/p50_s"] == 3.0 and m["agent/solver/p90_s"] == pytest.approx(9.2)
    assert timing_metrics([]) == {}


# -- per-agent advantages and metrics -------------------------------------------------------


def rollout(agent: str, reward: float) -> Rollout:
    return Rollout([1], [2], [-1.0], [0], "stop", reward=reward, agent=agent)


def test_advantages_are_normalised_within_each_agent_of_a_group():
    g = Group(
        "g", "p", "a", [rollout("proposer", 1), rollout("solver", 0), rollout("proposer", 1), rollout("solver", 1)]
    )
    adv = agent_advantages([g], "group_std")[0]
    # Proposers: both 1, so 0 each; solvers: 0 and 1, so ∓1/(std=0.7071) around their mean 0.5.
    assert adv[0] == adv[2] == 0.0
    assert adv[1] == pytest.approx(-0.5 / (2**-0.5 + 1e-6)) and adv[3] == pytest.approx(0.5 / (2**-0.5 + 1e-6))
    # A single-agent group: GRPO's own advantages, unchanged.
    single = Group("s", "p", "a", [rollout("", r) for r in (0.0, 1.0, 0.5)])
    assert agent_advantages([single], "batch_std") == scaled_advantages([[0.0, 1.0, 0.5]], "batch_std")


def test_the_batch_reports_each_agents_mean_reward():
    g = Group(
        "g", "p", "a", [rollout("proposer", 1), rollout("solver", 0), rollout("proposer", 0), rollout("solver", 0)]
    )
    m = batch_metrics([g])
    assert m["agent/proposer/reward_mean"] == 0.5 and m["agent/solver/reward_mean"] == 0.0
    assert not any(k.startswith("agent/") for k in batch_metrics([Group("s", "p", "a", [rollout("", 1.0)] * 2)]))


def test_a_groups_agents_survive_a_checkpoint_and_a_single_agent_group_writes_none():
    g = Group("g", "p", "a", [rollout("proposer", 1), rollout("solver", 0)])
    assert [r.agent for r in Group.from_json(g.to_json()).rollouts] == ["proposer", "solver"]
    assert "agent" not in Group("s", "p", "a", [rollout("", 1.0)]).to_json()["rollouts"][0]


# -- overcommit and late groups ---------------------------------------------------------------


def test_overcommit_admits_that_many_groups_beyond_the_gates_rule():
    gate = AdmissionGate(batch_groups=4, ahead=0, overcommit=2)
    assert gate.may_admit(version=0, admitted=0, rejected=0, want=10) == 6
    assert gate.may_admit(version=1, admitted=6, rejected=0, want=10) == 4
    cfg = RunConfig.model_validate({"task": {"name": "propose_solve"}, "buffer": {"unit": "episode", "overcommit": 3}})
    assert plan(cfg.buffer, "sync", 4, cfg.trainer).overcommit_groups == 3


def test_the_buffer_counts_groups_trained_a_version_or_more_late():
    buf = RolloutBuffer(capacity_groups=None, max_staleness=2)
    for version in (0, 1, 2):
        buf.put(Group(f"g{version}", "p", "a", [Rollout([1], [2], [-1.0], [version], "stop")]))
    buf.get(2, current_version=1)  # g0 is a version late, g1 is not
    assert buf.late == 1 and buf.stats()["buffer/late_groups"] == 1.0
    restored = RolloutBuffer(capacity_groups=None, max_staleness=2)
    restored.load_state_dict(buf.state_dict())
    assert restored.late == 1
    state = buf.state_dict()
    del state["late"]  # a checkpoint from before late groups were counted
    restored.load_state_dict(state)
    assert restored.late == 0


def test_the_late_overcommit_hook_hands_groups_over_by_admission_version_and_holds_the_overcommitted():
    hook = LateOvercommit(share=2)
    hook.admitted(seed=7, n=4, version=0)  # two for the batch, two overcommitted

    def ended(seed: int, *indices: int) -> list[Group]:
        return [Group(group_id(seed, i), "p", "a", []) for i in indices]

    def ids(groups: list[Group]) -> list[str]:
        return [g.group_id for g in groups]

    # Whatever order they end in, the version's share goes and the third waits.
    assert ids(hook.release(ended(7, 2, 0), version=0)) == [group_id(7, 2), group_id(7, 0)]
    assert hook.release(ended(7, 1), version=0) == []
    assert hook.release([], version=0) == []
    # The next version: the held group first (late), then nothing of version 1 while
    # group 7-3, admitted at 0, is still in flight.
    hook.admitted(seed=8, n=2, version=1)
    assert ids(hook.release(ended(8, 0), version=1)) == [group_id(7, 1)]
    assert hook.release(ended(8, 1), version=1) == []
    assert ids(hook.release(ended(7, 3), version=1)) == [group_id(7, 3), group_id(8, 0), group_id(8, 1)]


def test_the_late_overcommit_hook_is_off_unset_and_refused_where_nothing_is_overcommitted(monkeypatch):
    episodes = RunConfig.model_validate(
        {"task": {"name": "propose_solve"}, "buffer": {"unit": "episode", "overcommit": 2}}
    )
    assert LateOvercommit.forced(episodes, 4) is None
    monkeypatch.setenv(OVERCOMMIT_ENDS_LATE_ENV, "1")
    assert LateOvercommit.forced(episodes, 4) is not None
    barrier = RunConfig.model_validate({"task": {"name": "propose_solve"}, "buffer": {"unit": "group"}})
    with pytest.raises(ValueError, match=f"{OVERCOMMIT_ENDS_LATE_ENV}=1 .*buffer.overcommit above 0"):
        LateOvercommit.forced(barrier, 4)


# -- configs refused at launch ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"buffer": {"overcommit": 2}}, "buffer.unit"),
        (
            {"task": {"name": "propose_solve"}, "buffer": {"unit": "episode", "overcommit": 2, "max_staleness": 0}},
            "buffer.max_staleness",
        ),
        ({"buffer": {"unit": "episode"}}, "task.name"),
        (
            {"task": {"name": "propose_solve"}, "rewards": {"workers": 1, "mode": "pipelined"}},
            "rewards.mode 'pipelined'",
        ),
        ({"task": {"name": "propose_solve", "reward_funcs": ["os:getcwd"]}}, "task.reward_funcs"),
        ({"task": {"name": "propose_solve", "options": {"solver_p90_ratio": 0.5}}}, "solver_p90_ratio"),
    ],
)
def test_configs_that_cannot_run_episodes_are_refused_naming_the_field(config, names):
    with pytest.raises(ValidationError, match=names):
        check_runnable(RunConfig.model_validate(config))


def test_a_multi_agent_run_can_keep_the_barrier_or_schedule_by_episode():
    for unit in ("group", "episode"):
        cfg = RunConfig.model_validate({"task": {"name": "propose_solve"}, "buffer": {"unit": unit}})
        assert cfg.buffer.unit == unit
