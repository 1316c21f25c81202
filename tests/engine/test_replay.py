"""A run's schedule, recorded and replayed (workers/run/schedule.py).

The schedule's arithmetic alone, then whole runs: an async run of two inference workers
(whose groups reach the buffer in whatever order they end, so which groups make a batch
is the host's doing) records its schedule, and a replay of the same config under that
schedule trains the same batches bit for bit; so does a run that requeues stale prompts.
The runs that load weights inside their generate calls are replayed where they are
forced to: each update mode's run (test_update_modes_in_runs.py) and vLLM's in-flight run
(test_driver_vllm.py).
"""

from __future__ import annotations

import os
import queue

import pytest
import ray

from tests.engine.helpers import GONE_WAIT_S, TOKEN, assert_trained_the_same, wait_for, warm_started
from workers.config.presets import PRESETS, build, deep_merge
from workers.core.metric_names import TRAINED as EXACT
from workers.core.records import call_seed, group_id
from workers.core.run_actors import NAMESPACE, actor_name, run_actor_names
from workers.run.actors import BufferActor
from workers.run.buffer import FIRST_BATCH_HOLD_ENV, BufferPlan
from workers.run.driver import RunDriver
from workers.run.lifecycle import launch
from workers.run.paths import Confinement
from workers.run.schedule import (
    Admission,
    Batch,
    Load,
    RecordedUpdates,
    ReplayDiverged,
    ReplayedUpdates,
    Requeue,
    Schedule,
    ScheduleReplay,
    replay_problem,
    schedule_problem,
)

# -- the arithmetic ----------------------------------------------------------------------


def two_workers() -> Schedule:
    return Schedule(
        admissions=[Admission(0, 0, 2), Admission(1, 0, 2), Admission(0, 0, 2), Admission(1, 1, 2)],
        batches=[Batch(0, ("a", "b", "c", "d")), Batch(1, ("e", "f", "g", "h"))],
    )


def with_loads() -> Schedule:
    """two_workers, where worker 1's first call loaded version 1 after its third decode step."""
    schedule = two_workers()
    schedule.loads = [Load(1, 0, 3, 1)]
    return schedule


def test_a_schedule_round_trips_through_json_and_reports_its_size():
    for schedule in (two_workers(), with_loads()):
        again = Schedule.from_json(schedule.to_json())
        assert again == schedule
        assert schedule.bytes_per_step() == schedule.size_bytes() / 2 > 0
    # A schedule written without loads (a drain run's) has none.
    data = two_workers().to_json()
    del data["loads"]
    assert Schedule.from_json(data).loads == []


def test_each_call_of_each_worker_has_a_seed_of_its_own():
    seeds = {call_seed(7, worker, call) for worker in range(3) for call in range(1000)}
    assert len(seeds) == 3000 and call_seed(7, 0, 0) != call_seed(8, 0, 0)
    assert group_id(call_seed(0, 1, 2), 3) == "1000002-3"


@pytest.mark.parametrize(
    "data", [{}, {"admissions": [[0, 0]], "batches": []}, {"admissions": [], "batches": [["x", ["a"]]]}]
)
def test_a_malformed_schedule_is_refused_saying_what_a_schedule_is(data):
    with pytest.raises(ValueError, match=r"a schedule is \{'admissions': \[\[worker, version, groups\]"):
        Schedule.from_json(data)


def test_a_replayed_admission_waits_for_its_version_and_admits_the_recorded_groups():
    replay = ScheduleReplay(two_workers())
    assert replay.admit(1, 0, 2) == 2  # worker 1's first call, on version 0
    assert replay.admit(1, 0, 2) == 0  # its second started on version 1: wait for it
    assert replay.admit(1, 1, 2) == 2
    assert replay.admit(1, 1, 2) == 0  # no call left: it waits until the run ends
    with pytest.raises(ReplayDiverged, match="admission 0: inference worker 0 holds policy version 1"):
        replay.admit(0, 1, 2)  # worker 0 got newer weights than its recorded call's


def test_a_replayed_batch_is_trained_once_every_call_on_its_version_has_started():
    replay = ScheduleReplay(two_workers())
    assert replay.admit(0, 0, 2) == 2
    # Taken as soon as it is asked for (its groups in the buffer are the actor's business),
    # trained only once the calls recorded on its version have started.
    assert replay.next_batch(0) == (0, Batch(0, ("a", "b", "c", "d")))
    assert replay.untrainable(0) == (
        "2 recorded call(s) on policy version 0 or earlier to start and "
        "0 recorded load(s) of such a version inside a call"
    )
    assert replay.admit(1, 0, 2) == 2
    assert replay.untrainable(0) is not None  # nor worker 0's second
    assert replay.admit(0, 0, 2) == 2
    assert replay.untrainable(0) is None
    replay.taken()
    with pytest.raises(ReplayDiverged, match="batch 1: the trainer asks at policy version 2"):
        replay.next_batch(2)
    assert replay.next_batch(1) == (1, Batch(1, ("e", "f", "g", "h")))
    assert replay.untrainable(1) is not None  # worker 1's call on version 1 has not started
    assert replay.admit(1, 1, 2) == 2
    assert replay.untrainable(1) is None
    replay.taken()
    with pytest.raises(ReplayDiverged, match="past the 2 recorded"):
        replay.next_batch(2)


def test_a_replayed_batch_is_trained_once_every_load_inside_a_call_up_to_its_version_is_made():
    replay = ScheduleReplay(with_loads())
    assert replay.loads_of(1) == {0: [(3, 1)]} and replay.loads_of(0) == {}
    for worker in (0, 1, 0):
        assert replay.admit(worker, 0, 2) == 2
    replay.next_batch(0)
    replay.taken()
    # Every call on version ≤ 1 has started, but worker 1 has not yet loaded version 1
    # inside its first call: publishing version 2 now would leave it only that to load.
    assert replay.admit(1, 1, 2) == 2
    assert replay.untrainable(1) == (
        "0 recorded call(s) on policy version 1 or earlier to start and "
        "1 recorded load(s) of such a version inside a call"
    )
    with pytest.raises(ReplayDiverged, match=r"inference worker 1 made Load\(worker=1, call=0, step=2"):
        replay.loaded(Load(1, 0, 2, 1))
    replay.loaded(Load(1, 0, 3, 1))
    assert replay.untrainable(1) is None
    assert replay.next_batch(1) == (1, Batch(1, ("e", "f", "g", "h")))
    with pytest.raises(ReplayDiverged, match="the record's next is none"):
        replay.loaded(Load(0, 1, 1, 2))


@pytest.mark.slow  # a BufferActor on the engine's Ray cluster
def test_a_replayed_batch_is_taken_before_the_call_its_training_waits_for(cluster):
    """The trainer asks for its next batch before it trains the one at hand, so a recorded
    run may take a batch, freeing the room a worker's finished call waits in to put its
    groups, before that worker's next call starts on the batch's version. Forced here
    call by call on the run's buffer actor (one batch of room, one worker): the replay
    takes the batch once its groups are in, and lets it be trained once that call starts.
    A replay that held the take until then waited for a call that waited for the take."""
    from tests.engine.test_buffer import group

    first, second = [f"a{i}" for i in range(4)], [f"b{i}" for i in range(4)]
    schedule = Schedule(admissions=[Admission(0, 0, 4)] * 3, batches=[Batch(0, tuple(first)), Batch(1, tuple(second))])
    plan = BufferPlan(capacity_groups=4, ahead_batches=1, max_staleness=1, on_stale="drop")
    buffer = BufferActor.options(namespace=NAMESPACE).remote(plan, 4, schedule.to_json())
    try:
        assert ray.get(buffer.ready.remote()) and ray.get(buffer.replaying.remote())
        assert ray.get(buffer.admit.remote(0, 4, 0)) == 4
        assert ray.get(buffer.put.remote([group(g) for g in first], 0.0))[0] == 4
        assert ray.get(buffer.admit.remote(0, 4, 0)) == 4
        assert ray.get(buffer.put.remote([group(g) for g in second], 0.0))[0] == 0  # no room: the call waits
        assert "1 recorded call(s)" in ray.get(buffer.wait_trainable.remote(0, 0.0))
        groups, _ = ray.get(buffer.get.remote(4, 0, 60.0))
        assert groups is not None and [g.group_id for g in groups] == first
        assert ray.get(buffer.put.remote([group(g) for g in second], 0.0))[0] == 4
        assert ray.get(buffer.wait_trainable.remote(0, 0.0)) is not None
        assert ray.get(buffer.admit.remote(0, 4, 0)) == 4  # the third call, on version 0
        assert ray.get(buffer.wait_trainable.remote(0, 0.0)) is None
    finally:
        ray.kill(buffer)


class Staged:
    """A worker's staged weights, seen by a call: `versions` are what staged_version
    answers at successive asks (None: nothing staged yet), and apply loads the last."""

    def __init__(self, versions: list[int | None]) -> None:
        self.versions, self.asks, self.applied = versions, 0, []

    def staged_version(self) -> int | None:
        version = self.versions[min(self.asks, len(self.versions) - 1)]
        self.asks += 1
        return version

    def pending(self) -> bool:
        return self.versions[-1] is not None

    def apply(self) -> int:
        self.applied.append(self.versions[-1])
        return self.versions[-1]


def test_a_replayed_call_loads_after_its_recorded_step_only_and_waits_for_the_version():
    import threading

    staged, reports = Staged([None, None, 2]), []
    report = lambda *r: reports.append(r)  # noqa: E731
    updates = ReplayedUpdates(staged, staged.staged_version, [(3, 2)], report, threading.Event(), 0)
    # Weights are staged all along, but the record loaded nothing after steps 1 and 2.
    assert [updates.pending(), updates.pending()] == [False, False] and staged.asks == 0
    assert updates.pending()  # step 3: it asked until version 2 was staged
    assert staged.asks == 3  # None, None, then 2
    assert updates.apply() == 2 and reports == [(3, 2)]
    assert updates.pending() is False
    updates.finished()


def test_a_replayed_call_that_ends_early_or_sees_another_version_diverges():
    import threading

    staged = Staged([3])
    updates = ReplayedUpdates(staged, staged.staged_version, [(1, 2)], lambda *r: None, threading.Event(), 0)
    with pytest.raises(ReplayDiverged, match="version 3 is staged where the record loaded 2 after decode step 1"):
        updates.pending()
    short = ReplayedUpdates(staged, staged.staged_version, [(5, 2)], lambda *r: None, threading.Event(), 0)
    short.pending()
    with pytest.raises(ReplayDiverged, match="ended after 1 decode steps, before its recorded load of version 2"):
        short.finished()
    stopping = threading.Event()
    stopping.set()  # the run stops while the call waits: no load, no error
    waiting = ReplayedUpdates(Staged([None]), Staged([None]).staged_version, [(1, 2)], lambda *r: None, stopping, 0)
    assert waiting.pending() is False


def test_a_recorded_call_counts_its_decode_steps_and_reports_each_load():
    staged, reports = Staged([1]), []
    updates = RecordedUpdates(staged, lambda *r: reports.append(r))
    assert [updates.pending() for _ in range(4)] == [True] * 4
    assert updates.apply() == 1
    assert reports == [(4, 1)]


@pytest.mark.parametrize("mode", ["in_flight", "abort_resume", "abort_retry"])
def test_every_update_mode_and_requeue_can_be_replayed(mode):
    assert replay_problem(build("async", {"sync": {"update_mode": mode}}), False) is None
    assert (
        replay_problem(build("async", {"sync": {"update_mode": mode}, "buffer": {"on_stale": "requeue"}}), False)
        is None
    )


def test_every_preset_can_be_replayed():
    assert {name: replay_problem(PRESETS[name]["config"], False) for name in PRESETS} == dict.fromkeys(PRESETS)


def test_a_replayed_call_takes_the_requeued_groups_its_recorded_call_took():
    schedule = with_loads()
    schedule.requeues = [Requeue(0, 1, ("7-0", "7-1"))]
    assert Schedule.from_json(schedule.to_json()) == schedule
    replay = ScheduleReplay(schedule)
    assert replay.requeued_for(0, 1) == ("7-0", "7-1")
    assert replay.requeued_for(0, 0) == () and replay.requeued_for(1, 1) == ()


def test_a_requeued_take_waits_for_its_groups_and_requeues_one_still_in_the_buffer():
    from tests.engine.test_requeue_live import group
    from workers.run.buffer import RolloutBuffer

    buf = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    buf.put(group("a", "abc", 0))
    buf.put(group("b", "bcd", 0))
    buf.put(group("c", "cde", 1))
    assert [g.group_id for g in buf.get(1, current_version=1, ids=["c"])] == ["c"]  # a and b requeued
    buf.put(group("d", "def", 0))  # stale at version 1, not yet rejected
    with pytest.raises(queue.Empty):  # "e" was never put
        buf.take_requeued_ids(["b", "e"], timeout=0)
    got = buf.take_requeued_ids(["d", "b"], timeout=0)  # in the record's order; "d" requeued now
    assert [g.group_id for g in got] == ["d", "b"]
    assert buf.requeued == 3 and buf.take_requeued(5)[0].group_id == "a"


@pytest.mark.parametrize(
    ("overrides", "multi_agent", "needle"),
    [
        ({"buffer": {"unit": "episode"}}, False, "buffer.unit 'episode'"),
        ({}, True, "a multi-agent task"),
    ],
)
def test_what_a_schedule_does_not_record_cannot_be_replayed(overrides, multi_agent, needle):
    assert replay_problem(build("async", {}), False) is None
    problem = replay_problem(build("async", overrides), multi_agent)
    assert problem is not None and needle in problem


@pytest.mark.parametrize(
    ("overrides", "edit", "needle"),
    [
        ({"inference": {"num_workers": 1}}, None, "inference.num_workers is 1: set it to 2"),
        ({"trainer": {"batch_groups": 2}}, None, "the schedule's batches hold 4 groups, and trainer.batch_groups is 2"),
        ({"sync": {"update_mode": "drain"}}, "loads", "sync.update_mode 'drain'"),
        ({}, "requeues", "buffer.on_stale is 'drop'"),
        (
            {},
            "resumed",
            "its first batch trains policy version 3, not 0: the recorded run resumed from the checkpoint of step 3",
        ),
    ],
)
def test_a_record_the_config_could_not_follow_is_refused_naming_the_field(overrides, edit, needle):
    # The config two_workers() and with_loads() were recorded under.
    recorded = {"inference": {"num_workers": 2}, "trainer": {"batch_groups": 4}, "sync": {"update_mode": "in_flight"}}
    assert schedule_problem(with_loads(), build("async", recorded)) is None
    cfg = build("async", deep_merge(recorded, overrides))
    schedule = with_loads() if edit == "loads" else two_workers()
    if edit == "requeues":
        schedule.requeues = [Requeue(0, 1, ("a",))]
    if edit == "resumed":
        schedule.batches = [Batch(v + 3, b.group_ids) for v, b in enumerate(schedule.batches)]
    problem = schedule_problem(schedule, cfg)
    assert problem is not None and needle in problem, problem


def test_a_resumed_runs_record_is_followed_from_the_checkpoint_it_resumed_from():
    recorded = {"inference": {"num_workers": 2}, "trainer": {"batch_groups": 4}}
    cfg = build("async", recorded)
    schedule = two_workers()
    schedule.batches = [Batch(v + 3, b.group_ids) for v, b in enumerate(schedule.batches)]
    assert schedule_problem(schedule, cfg, resume_step=3) is None
    problem = schedule_problem(schedule, cfg, resume_step=2)
    assert problem is not None and "version 3, and the checkpoint it would resume from is of step 2" in problem
    assert "its first batch trains policy version 0" in (schedule_problem(two_workers(), cfg, resume_step=2) or "")


# -- whole runs --------------------------------------------------------------------------

STEPS = 6
CONFIG = {
    "seed": 11,
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    "warm_start": {"steps": 150, "noisy_steps": 20, "batch_size": 32},
    # Two workers: their groups interleave in the buffer as their calls happen to end.
    "inference": {"backend": "torch", "num_workers": 2},
    "placement": {"cpu_threads": 1},  # every run on the same thread count: the same rounding
    "trainer": {"batch_groups": 4, "group_size": 4, "lr": 5e-3},
    "stop": {"max_steps": STEPS, "max_minutes": 3},
}


def run(run_id: int, cache_dir: str, replay: dict | None = None, env: dict | None = None, **overrides) -> dict:
    """The async preset on CONFIG with `overrides`, to its end; `env`: the run's actors'
    environment variables (a test hook's switch)."""
    cfg = build("async", deep_merge(CONFIG, overrides)).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"))
    options = {"runtime_env": {"env_vars": env}} if env else {}
    warm_started(cfg, cache_dir)
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE, **options).remote(
        run_id, cfg, None, TOKEN, cache_dir, exit_when_done=False, confinement=confinement, replay=replay
    )
    try:
        out = ray.get(driver.run.remote(), timeout=240)
    finally:
        ray.kill(driver)
    out["series"] = {name: dict(points) for name, points in out["series"].items()}
    return out


# miles' layout on CONFIG: the run below that requeues stale prompts (its replay also stands
# for the presets that requeue or abort and resume, tests/engine/test_presets.py).
REQUEUE = {
    "sync": {"update_mode": "abort_resume"},
    "inference": {"num_workers": 1},
    "buffer": {"mode": "unbounded", "max_head_offpolicyness": 3, "max_staleness": 0, "on_stale": "requeue"},
}


@pytest.fixture(scope="module")
def original(cluster, cache_dir) -> dict:
    out = run(4601, cache_dir)
    assert out["state"] == "succeeded", out["error_detail"] or out["error"]
    return out


@pytest.mark.slow  # whole runs on the engine's Ray cluster
def test_an_async_run_records_each_call_and_each_batch_and_reports_the_size(original):
    schedule = original["schedule"]
    batches = Schedule.from_json(schedule).batches
    # One batch a step, taken at the version it trains, B groups each, no group twice.
    assert [b.version for b in batches] == list(range(STEPS))
    assert all(len(b.group_ids) == CONFIG["trainer"]["batch_groups"] for b in batches)
    trained = [g for b in batches for g in b.group_ids]
    assert len(set(trained)) == len(trained)
    admissions = Schedule.from_json(schedule).admissions
    # Each admission names the worker whose call it was. Whose calls land before the
    # last step is the host's timing (a worker started late on a loaded host may land
    # none), so each is one of the two, not necessarily both.
    workers = {a.worker for a in admissions}
    assert workers and workers <= {0, 1}
    for worker in (0, 1):  # each worker's versions only go up
        versions = [a.version for a in admissions if a.worker == worker]
        assert versions == sorted(versions)
    assert sum(a.groups for a in admissions) >= len(trained)
    # Each group is named by its call's seed, as a schedule written ahead of a run names it.
    calls, most = range(len(admissions)), max(a.groups for a in admissions)
    named = {group_id(call_seed(CONFIG["seed"], w, c), i) for w in (0, 1) for c in calls for i in range(most)}
    assert set(trained) <= named, sorted(set(trained) - named)[:5]
    series = original["series"]
    assert series["schedule/bytes"] == {STEPS: float(schedule["bytes"])}
    assert series["schedule/bytes_per_step"] == {STEPS: pytest.approx(schedule["bytes"] / STEPS)}


@pytest.mark.slow  # whole runs on the engine's Ray cluster
def test_a_replay_trains_the_same_batches_bit_for_bit(original, cache_dir):
    replayed = run(4602, cache_dir, replay=original["schedule"])
    assert replayed["state"] == "succeeded", replayed["error_detail"] or replayed["error"]
    # It followed the schedule: it recorded the same batches, and each worker the same
    # calls (how two workers' calls interleave in time is not part of it).
    assert replayed["schedule"]["batches"] == original["schedule"]["batches"]
    for worker in (0, 1):
        calls = [[a for a in out["schedule"]["admissions"] if a[0] == worker] for out in (original, replayed)]
        assert calls[0] == calls[1], worker
    assert replayed["policy_sha256"] == original["policy_sha256"]
    for name in EXACT:
        if name in original["series"]:
            assert replayed["series"][name] == original["series"][name], name
    # The ledger too, but for where the rows no batch trained were when the run stopped:
    # the schedule records batches, not the other groups' fates. Whether a call admitted
    # before the last batch had returned by then (waiting) or not (in_flight), and whether
    # its groups sat in the buffer while a get judged them stale (dropped_stale: a
    # replayed get waits for its batch's groups, judging the others meanwhile), is the
    # host's timing, in either run: once the replay's ledger had 2 of the original's 8
    # waiting or in-flight rows dropped as stale instead.
    assert untrained_merged(replayed["ledger"]) == untrained_merged(original["ledger"])


def untrained_merged(ledger: dict[str, float]) -> dict[str, float]:
    """`ledger` with the rows no batch trained (waiting, in flight, dropped as stale) as
    one count: drawn and trained rows stay apart."""
    out = dict(ledger)
    out["untrained"] = sum(out.pop(f"ledger/{k}") for k in ("waiting", "in_flight", "dropped_stale"))
    return out


@pytest.mark.slow  # whole runs on the engine's Ray cluster
def test_a_run_that_requeues_stale_prompts_replays_which_call_took_each_bit_for_bit(cluster, cache_dir):
    """miles' layout: abort_resume, stale groups' prompts requeued. The original's first
    batch is held until the buffer holds two batches of version-0 groups (a test hook), so
    with max_staleness 0 the second batch's worth goes stale at version 1 and is requeued,
    generated again and trained; the replay, not held, gives each requeued prompt to the
    call that took it."""
    batch = CONFIG["trainer"]["batch_groups"]
    first = run(4618, cache_dir, env={FIRST_BATCH_HOLD_ENV: str(2 * batch)}, **REQUEUE)
    assert first["state"] == "succeeded", first["error_detail"] or first["error"]
    requeues = Schedule.from_json(first["schedule"]).requeues
    assert sum(len(r.group_ids) for r in requeues) >= batch, requeues
    # The requeued prompts were generated again and trained, nothing stale was trained
    # or dropped; an unbounded stream has no capacity and reports the trainer's wait.
    s = first["series"]
    requeued, regenerated = max(s["buffer/requeued"].values()), max(s["buffer/regenerated"].values())
    assert 0 < regenerated <= requeued, (requeued, regenerated)
    assert set(s["buffer/dropped_stale"].values()) == {0.0}
    assert set(s["staleness/max"].values()) == {0.0}
    assert "buffer/capacity" not in s and "buffer/starved_s" in s
    again = run(4619, cache_dir, replay=first["schedule"], **REQUEUE)
    assert again["state"] == "succeeded", again["error_detail"] or again["error"]
    replayed = Schedule.from_json(again["schedule"])
    assert replayed.requeues == requeues[: len(replayed.requeues)] and replayed.requeues
    assert_trained_the_same(first, again)


def call_version(schedule: dict, gid: str) -> int:
    """The policy version the call that made group `gid` started on: its id is
    `<call seed>-<index>`, the seed run seed·10⁹ + worker·10⁶ + the worker's call count."""
    seed = int(gid.split("-")[0])
    worker, call = seed // 10**6 % 1000, seed % 10**6
    return [a[1] for a in schedule["admissions"] if a[0] == worker][call]


@pytest.mark.slow  # whole runs on the engine's Ray cluster
def test_a_replay_follows_the_schedule_it_is_given_not_its_own_timing(original, cache_dir, stub):
    """The original's schedule with one group moved from the second batch to the first:
    a run that merely repeated the original would train the original's batches. Launched
    as the site launches a replay (`launch(..., replay=)`), reporting to the site's ingest,
    which receives the schedule the replay followed."""
    schedule = {
        "admissions": original["schedule"]["admissions"],
        "batches": [list(b) for b in original["schedule"]["batches"]],
    }
    (_, first), (_, second) = schedule["batches"][:2]
    # A group of the second batch whose call started on version 0, so the first batch can wait for it.
    moved = next(g for g in second if call_version(schedule, g) == 0)
    first_ids, second_ids = list(first), list(second)
    i, j = len(first_ids) - 1, second_ids.index(moved)
    first_ids[i], second_ids[j] = second_ids[j], first_ids[i]
    schedule["batches"][0][1], schedule["batches"][1][1] = first_ids, second_ids
    cfg = build("async", CONFIG).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"))
    launch(4604, cfg, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=confinement, replay=schedule)
    wait_for(lambda: stub.status.get(4604) in ("succeeded", "failed"), 240, "a terminal status")
    assert stub.statuses[4604] == ["running", "succeeded"], stub.errors.get(4604)
    assert stub.schedule[4604]["batches"][:2] == schedule["batches"][:2]
    assert stub.series(4604)["loss"][1] != original["series"]["loss"][1]
    wait_for(lambda: not run_actor_names(4604), GONE_WAIT_S, "the run's actors to exit")


@pytest.mark.slow  # whole runs on the engine's Ray cluster
def test_a_replay_of_what_a_schedule_does_not_record_is_refused_naming_the_field(original, cache_dir):
    episodes = {"task": {"name": "calculator"}, "inference": {"max_new_tokens": 32}, "buffer": {"unit": "episode"}}
    out = run(4603, cache_dir, replay=original["schedule"], **episodes)
    assert out["state"] == "failed"
    assert "this run cannot be replayed: episodes run on their own clocks" in out["error"]
    # A config the record could not have come from is refused as well, before any actor.
    out = run(4604, cache_dir, replay=original["schedule"], trainer={"batch_groups": 2})
    assert out["state"] == "failed"
    assert "this run cannot be replayed: the schedule's batches hold 4 groups" in out["error"]
