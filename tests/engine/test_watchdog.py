"""The watchdog's parts on their own: an actor's watch (workers.core.watch) and the
driver's deadlines (workers.run.watchdog). Whole runs that hang are in
tests/engine/test_watchdog_runs.py."""

from __future__ import annotations

import threading

import pytest

from workers.config.run_config import RunConfig, WatchdogConfig
from workers.core.watch import GENERATE, HANG_ENV, TRAIN_STEP, WEIGHT_LOAD, WEIGHT_SEND, Watch, WatchReport
from workers.run.watchdog import MIN_SAMPLES, Watchdog, unanswered


def test_a_watch_times_each_operation_and_reports_the_open_ones():
    watch = Watch()
    with watch.op(TRAIN_STEP):
        inside = watch.drain()
    with pytest.raises(RuntimeError), watch.op(GENERATE):
        raise RuntimeError("a failed call is timed too")
    after = watch.drain()
    assert list(inside.open) == [TRAIN_STEP] and inside.open[TRAIN_STEP] <= inside.now
    assert after.open == {} and set(after.durations) == {TRAIN_STEP, GENERATE}
    assert watch.drain().durations == {}  # drained once
    with pytest.raises(ValueError, match="unknown operation 'nap'"), watch.op("nap"):
        pass


def test_the_hang_hook_holds_the_nth_call_of_its_operation_until_released(monkeypatch):
    monkeypatch.setenv(HANG_ENV, f"{GENERATE}:2")
    watch = Watch()
    with watch.op(GENERATE):  # the first call passes
        pass
    entered, finished = threading.Event(), threading.Event()

    def second_call():
        entered.set()
        with watch.op(GENERATE):
            pass
        finished.set()

    thread = threading.Thread(target=second_call)
    thread.start()
    assert entered.wait(10)
    assert not finished.wait(0.2)  # held, however long the test waits
    assert GENERATE in watch.drain().open
    watch.release()
    thread.join(10)
    assert finished.is_set()


@pytest.mark.parametrize("spec", ["generate", "generate:0", "nap:1"])
def test_a_malformed_hang_hook_is_refused_naming_the_variable(monkeypatch, spec):
    monkeypatch.setenv(HANG_ENV, spec)
    with pytest.raises(ValueError, match=HANG_ENV):
        Watch()


def cfg(**fields) -> WatchdogConfig:
    return WatchdogConfig(**{"multiple": 10, "floor_s": 2, "ceiling_s": 60, **fields})


def report(now: float, open_ops: dict | None = None, **durations) -> WatchReport:
    return WatchReport(open=open_ops or {}, durations={k.replace("_", " "): v for k, v in durations.items()}, now=now)


def test_the_deadline_is_the_ceiling_until_enough_calls_have_ended():
    dog = Watchdog(cfg())
    dog.observe("trainer", report(100.0, train_step=[0.5] * (MIN_SAMPLES - 1)))
    assert dog.deadline("trainer", TRAIN_STEP) == (60, "watchdog.ceiling_s: 4 earlier train steps, too few to judge by")
    dog.observe("trainer", report(101.0, train_step=[0.5]))
    assert dog.deadline("trainer", TRAIN_STEP)[0] == 5.0  # 10 × 0.5
    assert dog.deadline("inference worker 0", TRAIN_STEP)[0] == 60  # each actor its own history


def test_the_deadline_follows_the_p99_between_floor_and_ceiling():
    dog = Watchdog(cfg())
    dog.observe("a", report(0.0, generate=[0.01] * 50))  # 10 × 0.01 < floor
    dog.observe("b", report(0.0, generate=[1.0] * 98 + [3.0, 3.0]))  # p99 3.0
    dog.observe("c", report(0.0, generate=[100.0] * 10))  # 10 × 100 > ceiling
    assert dog.deadline("a", GENERATE)[0] == 2
    assert dog.deadline("a", GENERATE)[1].startswith("watchdog.floor_s")
    assert dog.deadline("b", GENERATE) == (30.0, "10 × the p99 of its last 100, 3 s")
    assert dog.deadline("c", GENERATE)[0] == 60


def test_an_operation_past_its_deadline_is_a_hang_naming_actor_node_and_operation():
    dog = Watchdog(cfg())
    dog.observe("inference worker 1", report(1000.0, generate=[1.0] * 20))
    dog.observe("inference worker 1", report(1010.0, {GENERATE: 1000.5}))
    assert dog.check() is None  # open 9.5 s of its 10
    dog.observe("inference worker 1", report(1011.0, {GENERATE: 1000.5, WEIGHT_LOAD: 1010.0}))
    hang = dog.check()
    assert hang is not None and (hang.actor, hang.operation, hang.open_s) == ("inference worker 1", GENERATE, 10.5)
    message = hang.message("10.0.0.7, pool=gen (Ray node 1f11c59d4fb8)")
    assert message.startswith(
        "The inference worker 1 on node 10.0.0.7, pool=gen (Ray node 1f11c59d4fb8) has been in its generate for "
        "10 s, past its deadline of 10 s (10 × the p99 of its last 20, 1 s)"
    )
    # both past their deadlines: the load inside the call is named
    dog.observe("inference worker 1", report(1100.0, {GENERATE: 1000.5, WEIGHT_LOAD: 1010.0}))
    assert dog.check().operation == WEIGHT_LOAD


def test_the_watchdog_section_refuses_a_floor_above_its_ceiling():
    with pytest.raises(ValueError, match=r"watchdog.floor_s \(90\) is above watchdog.ceiling_s \(60\)"):
        RunConfig.model_validate({"watchdog": {"floor_s": 90, "ceiling_s": 60}})


def test_actors_that_do_not_answer_the_poll_are_named_with_their_nodes():
    failure = unanswered({"trainer": "10.0.0.5 (Ray node 1f11c59d4fb8)", "reward worker 0": ""}, 300)
    assert failure.kind == "hang" and failure.operation == "poll"
    assert failure.actor == "trainer, reward worker 0" and failure.node == "10.0.0.5 (Ray node 1f11c59d4fb8)"
    assert failure.message.startswith(
        "The run's trainer (node 10.0.0.5 (Ray node 1f11c59d4fb8)), reward worker 0 did not answer the driver's "
        "poll within watchdog.floor_s (300 s)"
    )


def test_a_hangs_record_names_the_operation_with_its_deadline():
    dog = Watchdog(cfg())
    dog.observe("trainer", report(70.0, {TRAIN_STEP: 0.0}))  # the first step: the ceiling, 60 s
    failure = dog.check().failure("10.0.0.5 (Ray node 1f11c59d4fb8)")
    assert (failure.kind, failure.actor) == ("hang", "trainer")
    assert failure.operation == "train step (open 70 s, deadline 60 s)"
    assert failure.node == "10.0.0.5 (Ray node 1f11c59d4fb8)" and failure.node in failure.message


def test_a_weight_send_may_wait_as_long_as_a_generate_call():
    """A send into vLLM's engines waits for the worker's apply point: quick sends so far
    do not make a long generate call in flight there a hang of the trainer's."""
    dog = Watchdog(cfg())
    dog.observe("trainer", report(0.0, weight_send=[0.1] * 10))  # 10 × 0.1 < floor: 2 s
    dog.observe("inference worker 0", report(0.0, generate=[4.0] * 10))  # 10 × 4 = 40 s
    dog.observe("trainer", report(30.0, {WEIGHT_SEND: 0.0}))
    assert dog.check() is None
    assert dog.send_deadline("trainer")[0] == 40.0
    dog.observe("trainer", report(41.0, {WEIGHT_SEND: 0.0}))
    hang = dog.check()
    assert hang.operation == WEIGHT_SEND and "an inference worker's generate call's" in hang.basis
    assert Watchdog(cfg()).send_deadline("trainer")[0] == 60  # no history: the ceiling, as any
