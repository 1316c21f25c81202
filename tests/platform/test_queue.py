"""The run queue (runs/queue.py): limits, fair order, what a queued run waits for, and a
property test over random schedules of launches, cancels and completions."""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from runs import actions, in_ray, queue
from runs.models import Experiment, Run
from teams.models import Team
from workers.config.presets import build
from workers.config.run_config import RunConfig
from workers.run.admission import Capacity, demand

Status = Run.Status
ACTIVE = (Status.STARTING, Status.RUNNING, Status.CANCELLING)
GiB = 2**30


@pytest.fixture(autouse=True)
def no_sized_runs():
    """The scheduler keeps each run's demand across passes; a test's runs start unsized
    (SQLite may give a new run an earlier test's id)."""
    queue._DEMANDS.clear()


@pytest.fixture
def limits(settings):
    settings.ROLLWAY_MAX_RUNNING = 2
    settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 2
    return settings


@pytest.fixture
def other_experiment(owner):
    return Experiment.objects.create(team=Team.objects.create(name="Annex"), name="e", created_by=owner)


def workers(n: int) -> dict:
    return build("async", {"inference": {"num_workers": n}}).model_dump(mode="json")


def cpus(config: dict) -> float:
    return demand(RunConfig.model_validate(config)).cpus


def refreshed(*runs: Run) -> list[Run]:
    for run in runs:
        run.refresh_from_db()
    return list(runs)


# --- limits -------------------------------------------------------------------------


def test_a_run_is_scheduled_when_the_site_the_team_and_the_cluster_have_room(schedule, limits, make_run, enqueued):
    run = make_run()
    assert schedule() == [run.pk]
    [run] = refreshed(run)
    assert (run.status, run.phase) == (Status.QUEUED, queue.SCHEDULED)
    assert enqueued == [("launch_run", run.pk)]


def test_the_site_limit_counts_starting_running_cancelling_and_scheduled_runs(schedule, limits, make_run):
    limits.ROLLWAY_MAX_RUNNING = limits.ROLLWAY_MAX_RUNNING_PER_TEAM = 3
    make_run(status=Status.RUNNING)
    make_run(status=Status.CANCELLING)
    make_run(phase=queue.SCHEDULED)
    waiting = make_run()
    assert schedule() == []
    assert waiting.waiting_for() is not None
    [waiting] = refreshed(waiting)
    assert waiting.waiting_for() == "3 runs are active (ROLLWAY_MAX_RUNNING=3)"


def test_a_team_at_its_limit_waits_while_another_team_starts(schedule, limits, make_run, other_experiment):
    limits.ROLLWAY_MAX_RUNNING = 5
    limits.ROLLWAY_MAX_RUNNING_PER_TEAM = 1
    make_run(status=Status.RUNNING)
    ours = make_run()
    theirs = make_run(experiment=other_experiment)
    assert schedule() == [theirs.pk]
    [ours] = refreshed(ours)
    assert ours.waiting_for() == "team Lab has 1 active run (ROLLWAY_MAX_RUNNING_PER_TEAM=1)"


def test_a_run_waits_for_the_cpus_the_cluster_has_free(schedule, driver, limits, make_run):
    driver.available = Capacity(cpus=0.5, memory_bytes=16 * GiB)
    run = make_run(config=workers(2))
    assert schedule() == []
    [run] = refreshed(run)
    assert run.waiting_for() == "the cluster has 0.50 of the 0.75 CPUs it needs free"
    driver.available = None  # the other user of the cluster left
    assert schedule() == [run.pk]


def test_the_cluster_total_is_shared_by_runs_not_yet_placed_in_ray(schedule, driver, limits, make_run):
    # Ray still reports all 1.0 CPU free: the scheduled run has not placed its actors.
    driver.capacity = Capacity(cpus=1.0, memory_bytes=16 * GiB)
    first, second = make_run(config=workers(2)), make_run(config=workers(2))
    assert schedule() == [first.pk]
    [second] = refreshed(second)
    assert second.waiting_for() == "the cluster has 0.25 of the 0.75 CPUs it needs free"


def on_gpus(n: int) -> dict:
    """A run whose n inference workers and trainer ask for a GPU each."""
    return build("async", {"inference": {"num_workers": n}, "placement": {"devices": "gpu"}}).model_dump(mode="json")


def test_gpus_are_shared_by_runs_not_yet_placed_and_by_other_users(schedule, driver, limits, make_run):
    driver.capacity = Capacity(cpus=16.0, memory_bytes=64 * GiB, gpus=4.0)
    first, second = make_run(config=on_gpus(2)), make_run(config=on_gpus(2))
    assert schedule() == [first.pk]  # 3 of 4 GPUs taken, though Ray still reports all 4 free
    [second] = refreshed(second)
    assert second.waiting_for() == "the cluster has 1 of the 3 GPUs it needs free"
    Run.objects.filter(pk=first.pk).update(status=Status.SUCCEEDED)
    driver.available = Capacity(cpus=16.0, memory_bytes=64 * GiB, gpus=2.0)  # another user holds two
    assert schedule() == []
    [second] = refreshed(second)
    assert second.waiting_for() == "the cluster has 2 of the 3 GPUs it needs free"
    driver.available = None
    assert schedule() == [second.pk]


def test_a_run_waits_for_memory_the_cluster_has_free(schedule, driver, limits, make_run):
    driver.available = Capacity(cpus=2.0, memory_bytes=GiB // 2)
    run = make_run()
    assert schedule() == []
    [run] = refreshed(run)
    assert run.waiting_for().startswith("the cluster has 0.50 GiB of the ")
    assert run.waiting_for().endswith(" GiB of memory it needs free")


def test_nothing_is_scheduled_while_ray_does_not_answer(schedule, driver, limits, make_run, settings):
    run = make_run()
    settings.RAY_ADDRESS = "10.0.0.9:6380"
    driver.fail_with = ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6380")
    assert schedule() == []
    [run] = refreshed(run)
    assert run.waiting_for().startswith("Ray at 10.0.0.9:6380 is unreachable: check RAY_ADDRESS")


def test_a_runs_demand_is_sized_once_across_passes(schedule, driver, limits, make_run, monkeypatch):
    """Sizing a run may read its checkpoint, tokenizer and dataset: the scheduler keeps
    each run's demand rather than sizing every active run again at every pass."""
    sized = []
    monkeypatch.setattr(queue, "demand", lambda cfg: sized.append(cfg) or demand(cfg))
    running = make_run(status=Status.RUNNING, config=workers(1))
    driver.available = Capacity(cpus=0.0, memory_bytes=16 * GiB)  # nothing free: the queued run waits
    waiting = make_run(config=workers(2))
    for _ in range(3):
        assert schedule() == []
    assert len(sized) == 2, [running.pk, waiting.pk]


def test_the_scheduler_does_not_ask_ray_when_nothing_waits(monkeypatch, limits, make_run):
    make_run(status=Status.RUNNING)
    make_run(phase=queue.SCHEDULED)
    monkeypatch.setattr(in_ray, "ray_lifecycle", lambda: pytest.fail("Ray was asked"))
    assert queue.do_schedule_queue() == []


def test_a_scheduler_pass_reads_each_runs_config_at_most_once(schedule, limits, make_run, monkeypatch):
    """A stored config was validated at launch: a pass reads a run's JSON back into a
    RunConfig once however many checks use it, and not at all for a run that waits
    for the site's limit."""
    limits.ROLLWAY_MAX_RUNNING = limits.ROLLWAY_MAX_RUNNING_PER_TEAM = 3
    make_run(status=Status.RUNNING)
    make_run()
    make_run()
    make_run()  # waits: the site's limit is reached
    read = []
    validate = RunConfig.model_validate
    monkeypatch.setattr(RunConfig, "model_validate", lambda obj, *a, **kw: read.append(obj) or validate(obj, *a, **kw))
    assert len(schedule()) == 2
    assert len(read) == 3  # the running run's and the two scheduled ones


def test_a_run_is_scheduled_once_however_often_the_scheduler_runs(schedule, limits, make_run, enqueued):
    run = make_run()
    schedule()
    schedule()
    assert enqueued == [("launch_run", run.pk)]


def test_a_scheduler_that_read_a_run_before_it_was_cancelled_does_not_schedule_it(
    schedule, limits, make_run, monkeypatch, enqueued
):
    run = make_run()
    real = queue.queued_in_order

    def read_then_user_cancels(**kwargs):
        runs = real(**kwargs)
        Run.objects.get(pk=run.pk).transition(Status.CANCELLING)
        return runs

    monkeypatch.setattr(queue, "queued_in_order", read_then_user_cancels)
    assert schedule() == []
    assert enqueued == []


# --- order and position ---------------------------------------------------------------


def test_teams_take_turns_whatever_the_priorities_and_priority_orders_a_teams_own_runs(
    make_run, other_experiment, limits
):
    a1, a2, a3 = make_run(name="a1"), make_run(name="a2"), make_run(name="a3")
    b1, b2 = make_run(name="b1", experiment=other_experiment), make_run(name="b2", experiment=other_experiment)
    urgent = make_run(name="urgent", priority=5, experiment=other_experiment)
    order = Run.objects.filter(status=Status.QUEUED).in_queue_order()
    assert [r.name for r in order] == ["a1", "urgent", "a2", "b1", "a3", "b2"]
    assert [r.queue_position() for r in (a1, urgent, a2, b1, a3, b2)] == [1, 2, 3, 4, 5, 6]


def test_a_team_with_fewer_runs_active_takes_the_next_turn(make_run, other_experiment, limits):
    make_run(name="a running", status=Status.RUNNING)
    a1, a2 = make_run(name="a1"), make_run(name="a2")
    b1, b2 = make_run(name="b1", experiment=other_experiment), make_run(name="b2", experiment=other_experiment)
    order = Run.objects.filter(status=Status.QUEUED).in_queue_order()
    assert [r.name for r in order] == ["b1", "a1", "b2", "a2"]
    assert [r.queue_position() for r in (b1, a1, b2, a2)] == [1, 2, 3, 4]


def test_only_queued_runs_have_a_position_and_a_reason(make_run):
    running = make_run(status=Status.RUNNING)
    assert (running.queue_position(), running.waiting_for()) == (None, None)


def test_a_queued_run_the_scheduler_has_not_seen_says_so(make_run):
    run = make_run()
    assert (run.queue_position(), run.waiting_for()) == (1, queue.NOT_SEEN)


def test_a_run_behind_one_that_waits_for_the_cluster_waits_too(schedule, driver, limits, make_run, other_experiment):
    driver.capacity = Capacity(cpus=1.0, memory_bytes=16 * GiB)
    # holds 0.5 of the 1.0 CPU; its team, having a run active, takes its turn second
    make_run(status=Status.RUNNING, config=workers(1), experiment=other_experiment)
    big = make_run(config=workers(3))  # needs 1.0: waits for the running one to end
    small = make_run(config=workers(1), experiment=other_experiment)  # would fit now
    assert schedule() == []
    big, small = refreshed(big, small)
    assert big.waiting_for() == "the cluster has 0.50 of the 1.00 CPUs it needs free"
    assert small.waiting_for() == f"run #{big.pk} is ahead of it and waits for the cluster"


def test_the_api_shows_a_queued_runs_position_and_what_it_waits_for(schedule, limits, client_for, owner, make_run):
    limits.ROLLWAY_MAX_RUNNING = 1
    make_run(status=Status.RUNNING)
    run = make_run()
    schedule()
    body = client_for(owner).get(f"/api/runs/{run.pk}").json()
    assert (body["queue_position"], body["waiting_for"]) == (1, "1 run is active (ROLLWAY_MAX_RUNNING=1)")


def test_the_run_page_shows_a_queued_runs_position_and_what_it_waits_for(schedule, limits, client_for, owner, make_run):
    limits.ROLLWAY_MAX_RUNNING = 1
    make_run(status=Status.RUNNING)
    run = make_run()
    schedule()
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert "#1 in queue" in html and "1 run is active (ROLLWAY_MAX_RUNNING=1)" in html


# --- the hooks: after a launch commits, after a run ends ------------------------------


def test_a_run_that_ends_asks_the_scheduler_to_look(make_run, enqueued, django_capture_on_commit_callbacks):
    run = make_run(status=Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_set_run_status(run, Status.SUCCEEDED)
    assert enqueued == [("schedule_queue", None)]


def test_a_status_change_that_is_not_an_end_does_not(make_run, enqueued, django_capture_on_commit_callbacks):
    run = make_run(status=Status.STARTING)
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_set_run_status(run, Status.RUNNING)
    assert enqueued == []


# --- property: random schedules -------------------------------------------------------

TEAMS = 3
# (what, team or index, priority, inference workers): launches are drawn three times as
# often as the rest, so that queues actually build up.
LAUNCH = st.tuples(st.just("launch"), st.integers(0, TEAMS - 1), st.integers(0, 1), st.integers(1, 3))
OPS = st.lists(
    st.one_of(
        LAUNCH,
        LAUNCH,
        LAUNCH,
        st.tuples(st.just("finish"), st.integers(0, 7), st.just(0), st.just(0)),
        st.tuples(st.just("cancel"), st.integers(0, 7), st.just(0), st.just(0)),
    ),
    min_size=4,
    max_size=30,
)


@pytest.fixture
def three_teams(owner):
    return [
        Experiment.objects.create(team=Team.objects.create(name=f"T{k}"), name="e", created_by=owner)
        for k in range(TEAMS)
    ]


class Simulation:
    """Drives the queue as the Celery worker would: every message the platform sends is
    delivered at once (schedule_queue, launch_run, cancel_run), and a started driver
    reports running. Checks the limits after every step and records queue order."""

    def __init__(self, driver, experiments, max_running, max_per_team, capacity, captured):
        self.driver, self.experiments = driver, experiments
        self.max_running, self.max_per_team, self.capacity = max_running, max_per_team, capacity
        self.captured, self.enqueued = captured, None
        self.scheduled: list[int] = []
        self.counter = itertools.count()

    def deliver(self) -> None:
        from runs import in_ray, tasks

        while self.enqueued:
            name, run_id = self.enqueued.pop(0)
            with self.captured(execute=True):
                if name == "schedule_queue":
                    self.scheduled += tasks.schedule_queue()
                elif name == "launch_run":
                    in_ray.do_start_in_ray(run_id)
                    run = Run.objects.get(pk=run_id)
                    if run.status == Status.STARTING:
                        actions.do_set_run_status(run, Status.RUNNING)
                elif name == "cancel_run":
                    in_ray.do_stop_in_ray(run_id)
            self.check_limits()

    def check_limits(self) -> None:
        active = list(queue.active_runs().select_related("experiment__team"))
        assert len(active) <= self.max_running
        for team in {r.experiment.team_id for r in active}:
            assert sum(r.experiment.team_id == team for r in active) <= self.max_per_team
        assert sum(cpus(r.config) for r in active) <= self.capacity.cpus + 1e-9

    def launch(self, team: int, priority: int, n_workers: int) -> None:
        Run.objects.create(
            experiment=self.experiments[team],
            name=f"r{next(self.counter)}",
            preset="async",
            config=workers(n_workers),
            priority=priority,
        )
        self.enqueued.append(("schedule_queue", None))  # what do_launch_run sends on commit

    def nth(self, statuses, k: int) -> Run | None:
        runs = list(Run.objects.filter(status__in=statuses).order_by("pk"))
        return runs[k % len(runs)] if runs else None

    def finish(self, k: int) -> None:
        run = self.nth([Status.RUNNING], k)
        if run is not None:
            with self.captured(execute=True):
                actions.do_set_run_status(run, Status.SUCCEEDED)
            self.driver.alive.discard(run.pk)

    def cancel(self, k: int) -> None:
        run = self.nth([Status.QUEUED, Status.STARTING, Status.RUNNING], k)
        if run is not None:
            with self.captured(execute=True):
                actions.do_cancel_run(None, run)


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=OPS,
    max_running=st.integers(1, 3),
    max_per_team=st.integers(1, 2),
    cluster_cpus=st.sampled_from([1.0, 2.0, 4.0]),
)
def test_any_schedule_keeps_the_limits_serves_each_team_in_order_and_starts_every_run(
    ops,
    max_running,
    max_per_team,
    cluster_cpus,
    driver,
    three_teams,
    settings,
    enqueued,
    django_capture_on_commit_callbacks,
):
    settings.ROLLWAY_MAX_RUNNING = max_running
    settings.ROLLWAY_MAX_RUNNING_PER_TEAM = max_per_team
    driver.capacity = Capacity(cpus=cluster_cpus, memory_bytes=16 * GiB)
    driver.alive.clear()
    with transaction.atomic():
        sim = Simulation(
            driver, three_teams, max_running, max_per_team, driver.capacity, django_capture_on_commit_callbacks
        )
        sim.enqueued = enqueued
        enqueued.clear()
        for what, arg, priority, n_workers in ops:
            if what == "launch":
                sim.launch(arg, priority, n_workers)
            elif what == "finish":
                sim.finish(arg)
            else:
                sim.cancel(arg)
            sim.deliver()

        # No starvation: once the others finish, every queued run starts.
        for _ in range(Run.objects.count() + 1):
            for _running in Run.objects.filter(status=Status.RUNNING):
                sim.finish(0)
            sim.enqueued.append(("schedule_queue", None))
            sim.deliver()
        ended = dict(Run.objects.values_list("pk", "status"))
        assert set(ended.values()) <= {Status.SUCCEEDED, Status.CANCELLED}
        assert {pk for pk, status in ended.items() if status == Status.SUCCEEDED} <= set(sim.scheduled)
        # FIFO within a team and a priority: scheduled in the order they were launched.
        runs = {r.pk: r for r in Run.objects.select_related("experiment")}
        for team, priority in itertools.product([e.team_id for e in three_teams], (0, 1)):
            same = [pk for pk in sim.scheduled if (runs[pk].experiment.team_id, runs[pk].priority) == (team, priority)]
            assert same == sorted(same)
        transaction.set_rollback(True)  # the next example starts from an empty queue


def test_a_team_s_runs_of_one_priority_start_in_the_order_they_were_launched(
    schedule, limits, make_run, django_capture_on_commit_callbacks
):
    limits.ROLLWAY_MAX_RUNNING = 1
    runs = [make_run(name=f"r{k}") for k in range(3)]
    started = []
    for _ in runs:
        [scheduled] = schedule()
        started.append(scheduled)
        with django_capture_on_commit_callbacks(execute=True):
            actions.do_set_run_status(Run.objects.get(pk=scheduled), Status.FAILED, error="done")
    assert started == [r.pk for r in runs]


@pytest.mark.django_db(transaction=True)
def test_schedulers_running_at_once_never_schedule_more_than_the_limit(driver, limits, make_run, monkeypatch, enqueued):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL): SQLite serializes every writer anyway")
    import contextlib
    import threading

    from django.db import close_old_connections

    runs = [make_run(name=f"r{k}") for k in range(6)]
    real = queue.queued_in_order
    # Without the scheduler's lock, the barrier makes all four read the queue before any
    # claims a run (the over-scheduling this test exists to catch, made certain); with it,
    # the first reader waits alone, the barrier breaks, and the rest read one by one.
    all_read = threading.Barrier(4, timeout=2.0)

    def read_together(**kwargs):
        found = real(**kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            all_read.wait()
        return found

    monkeypatch.setattr(queue, "queued_in_order", read_together)
    scheduled: list[int] = []

    def scheduler():
        try:
            scheduled.extend(queue.do_schedule_queue())
        finally:
            close_old_connections()

    threads = [threading.Thread(target=scheduler) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(scheduled) == [runs[0].pk, runs[1].pk]
    assert queue.active_runs().count() == 2
    assert sorted(enqueued) == [("launch_run", runs[0].pk), ("launch_run", runs[1].pk)]


def test_when_a_run_is_scheduled_the_runs_behind_it_hear_their_new_place(schedule, limits, make_run, monkeypatch):
    from runs import events

    limits.ROLLWAY_MAX_RUNNING = 1
    running = make_run(status=Status.RUNNING)
    first, second = make_run(name="first"), make_run(name="second")
    schedule()  # both wait; their reasons are recorded
    sent = []
    monkeypatch.setattr(events, "send_status", lambda run: sent.append(run.summary()))
    running.transition(Status.SUCCEEDED)
    assert schedule() == [first.pk]
    assert {s["id"]: s["queue_position"] for s in sent} == {first.pk: None, second.pk: 1}


def test_reconcile_does_not_resend_the_launch_of_a_run_scheduled_after_a_long_wait(
    schedule, limits, make_run, enqueued
):
    from datetime import timedelta

    from django.utils import timezone

    from runs import reconcile

    run = make_run(status_changed_at=timezone.now() - timedelta(seconds=reconcile.QUEUED_RESEND_S * 10))
    assert schedule() == [run.pk]
    enqueued.clear()
    reconcile.do_reconcile_runs()
    assert enqueued == []
