"""Dynamic sampling in the buffer (trainer.dynamic_sampling, workers/run/buffer.py): groups
whose rewards are all equal are dropped before they take a place, counted, given back to
the admission gate so fresh groups replace them, and a run that only ever produces such
groups fails saying so instead of generating forever."""

from __future__ import annotations

import queue

import pytest

from workers.config.run_config import BufferConfig, TrainerConfig
from workers.core.records import Group, Rollout
from workers.run.buffer import AdmissionGate, NoSignalError, RolloutBuffer, plan


def group(gid: str, rewards: list[float]) -> Group:
    rollouts = [Rollout([1], [3, 2], [-1.0, -1.0], [0, 0], "stop", reward=r, group_id=gid) for r in rewards]
    return Group(group_id=gid, prompt="a=", answer="a", rollouts=rollouts)


UNIFORM, MIXED = [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]


def test_uniform_groups_are_dropped_counted_and_free_their_place():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True)
    for i, rewards in enumerate([UNIFORM, MIXED, [0.0, 0.0, 0.0], MIXED]):
        assert buf.put(group(str(i), rewards)) == pytest.approx(0.0, abs=0.05)
    assert buf.group_ids() == ["1", "3"]
    assert buf.dropped_uniform == 2 and buf.rejected == 2
    assert buf.received == 4  # every group put is accounted for
    assert buf.stats()["buffer/dropped_uniform"] == 2.0
    assert [g.group_id for g in buf.get(2, current_version=0)] == ["1", "3"]


def test_offer_drops_uniform_groups_as_put_does_even_when_full():
    buf = RolloutBuffer(capacity_groups=2, max_staleness=1, drop_uniform=True)
    groups = [group("0", MIXED), group("1", UNIFORM), group("2", MIXED), group("3", UNIFORM), group("4", MIXED)]
    # "3" is dropped, not stored, so it passes the full buffer; "4" waits for room.
    assert buf.offer(groups) == 4
    assert buf.group_ids() == ["0", "2"] and buf.dropped_uniform == 2 and buf.received == 4


def test_without_dynamic_sampling_uniform_groups_are_kept():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1)
    buf.put(group("u", UNIFORM))
    assert buf.group_ids() == ["u"] and buf.rejected == 0
    assert "buffer/dropped_uniform" not in buf.stats()


def test_the_gate_admits_fresh_groups_in_place_of_dropped_ones_so_the_trainer_gets_b():
    """A synchronous run (ahead 0), B = 2: each step the producer may leave 2 groups live;
    every other group it makes is uniform. The trainer still gets 2 groups per step, all
    mixed, and what is live never passes the gate's limit."""
    b = 2
    gate, buf = AdmissionGate(b, ahead=0), RolloutBuffer(2 * b, max_staleness=10, drop_uniform=True)
    admitted, made = 0, 0
    for version in range(3):
        while buf.depth < b:
            n = gate.may_admit(version, admitted, buf.rejected, want=1)
            assert n == 1, "the gate must admit a group in place of each dropped one"
            admitted += n
            buf.put(group(f"{version}-{made}", UNIFORM if made % 2 == 0 else MIXED))
            made += 1
            assert admitted - buf.rejected <= gate.limit(version)
        assert gate.may_admit(version, admitted, buf.rejected, want=1) == 0  # a full batch: no more
        got = buf.get(b, current_version=version, timeout=1.0)
        assert len(got) == b and all(len({r.reward for r in g.rollouts}) > 1 for g in got)
    assert buf.dropped_uniform == 6 and buf.total_got == 6


def test_get_fails_with_the_fix_after_too_many_uniform_groups_in_a_row():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True, max_uniform_run=3)
    buf.put(group("m", MIXED))
    for i in range(2):
        buf.put(group(f"u{i}", UNIFORM))
    with pytest.raises(queue.Empty):  # 2 in a row: still waiting, not failing
        buf.get(2, current_version=0, timeout=0.05)
    buf.put(group("u2", UNIFORM))
    with pytest.raises(NoSignalError, match="dropped 3 groups in a row .* trainer.dynamic_sampling_max_batches"):
        buf.get(2, current_version=0, timeout=0.05)


def test_a_batch_taken_resets_the_uniform_run():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True, max_uniform_run=3)
    for i in range(2):
        buf.put(group(f"u{i}", UNIFORM))
    buf.put(group("m", MIXED))
    buf.get(1, current_version=0)
    for i in range(2, 4):
        buf.put(group(f"u{i}", UNIFORM))
    buf.put(group("m2", MIXED))
    assert [g.group_id for g in buf.get(1, current_version=0)] == ["m2"]  # 2 in a row since: no failure


def test_the_count_survives_a_checkpoint_and_old_checkpoints_load():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True, max_uniform_run=10)
    buf.put(group("u", UNIFORM))
    buf.put(group("m", MIXED))
    state = buf.state_dict()
    again = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True, max_uniform_run=10)
    again.load_state_dict(state)
    assert (again.dropped_uniform, again.rejected, again.received) == (1, 1, 2)
    old = {k: v for k, v in state.items() if k not in ("dropped_uniform", "uniform_run")}
    again.load_state_dict(old)
    assert again.dropped_uniform == 0


def test_the_plan_turns_it_on_from_the_trainer_section():
    on = plan(BufferConfig(), "async", 4, TrainerConfig(dynamic_sampling=True, dynamic_sampling_max_batches=5))
    assert on.drop_uniform and on.max_uniform_run == 5 * 4
    off = plan(BufferConfig(), "async", 4, TrainerConfig())
    assert not off.drop_uniform and off.max_uniform_run is None


def test_what_the_buffer_drops_is_what_the_zero_spread_metric_counts():
    """One rule for a group without spread: rewards a float rounding apart (a verifier
    summing partial credits) count as equal for dynamic sampling and for
    reward/zero_std_frac alike; a real difference does not."""
    from workers.train.batch_stats import batch_metrics

    rounded = [0.1 + 0.2, 0.3, 0.3]  # 0.30000000000000004, 0.3, 0.3
    groups = [group("0", rounded), group("1", MIXED)]
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1, drop_uniform=True)
    for g in groups:
        buf.put(g)
    assert buf.group_ids() == ["1"] and buf.dropped_uniform == 1
    assert batch_metrics(groups)["reward/zero_std_frac"] == 0.5
