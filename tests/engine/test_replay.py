"""A run's schedule, recorded and replayed (workers/run/schedule.py).

The schedule's arithmetic alone, then whole runs: an async run of two inference workers
(whose groups reach the buffer in whatever order they end, so which groups make a batch
is the host's doing) records its schedule, and a replay of the same config under that
schedule trains the same batches bit for bit.
"""

from __future__ import annotations

import os

import pytest
import ray

from tests.engine.helpers import GONE_WAIT_S, TOKEN, wait_for
from workers.config.presets import build, deep_merge
from workers.core.metric_names import TRAINED as EXACT
from workers.core.records import call_seed, group_id
from workers.core.run_actors import NAMESPACE, actor_name, run_actor_names
from workers.run.driver import RunDriver
from workers.run.lifecycle import launch
from workers.run.paths import Confinement
from workers.run.schedule import Admission, Batch, ReplayDiverged, Schedule, ScheduleReplay, replay_problem

# -- the arithmetic ----------------------------------------------------------------------


def two_workers() -> Schedule:
    return Schedule(
        admissions=[Admission(0, 0, 2), Admission(1, 0, 2), Admission(0, 0, 2), Admission(1, 1, 2)],
        batches=[Batch(0, ("a", "b", "c", "d")), Batch(1, ("e", "f", "g", "h"))],
    )


def test_a_schedule_round_trips_through_json_and_reports_its_size():
    schedule = two_workers()
    again = Schedule.from_json(schedule.to_json())
    assert again == schedule
    assert schedule.bytes_per_step() == schedule.size_bytes() / 2 > 0


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


def test_a_replayed_batch_waits_until_every_call_on_its_version_has_started():
    replay = ScheduleReplay(two_workers())
    assert replay.admit(0, 0, 2) == 2
    assert replay.next_batch(0) is None  # worker 1's call on version 0 has not started
    assert replay.admit(1, 0, 2) == 2
    assert replay.next_batch(0) is None  # nor worker 0's second
    assert replay.admit(0, 0, 2) == 2
    assert replay.next_batch(0) == (0, Batch(0, ("a", "b", "c", "d")))
    replay.taken()
    with pytest.raises(ReplayDiverged, match="batch 1: the trainer asks at policy version 2"):
        replay.next_batch(2)
    assert replay.next_batch(1) is None  # worker 1's call on version 1 has not started
    assert replay.admit(1, 1, 2) == 2
    assert replay.next_batch(1) == (1, Batch(1, ("e", "f", "g", "h")))
    replay.taken()
    with pytest.raises(ReplayDiverged, match="past the 2 recorded"):
        replay.next_batch(2)


@pytest.mark.parametrize(
    ("overrides", "multi_agent", "needle"),
    [
        ({"sync": {"update_mode": "in_flight"}}, False, "sync.update_mode 'in_flight'"),
        ({"buffer": {"on_stale": "requeue"}}, False, "buffer.on_stale 'requeue'"),
        ({"buffer": {"unit": "episode"}}, False, "buffer.unit 'episode'"),
        ({}, True, "a multi-agent task"),
    ],
)
def test_what_a_schedule_does_not_record_cannot_be_replayed(overrides, multi_agent, needle):
    assert replay_problem(build("async", {}), False) is None
    problem = replay_problem(build("async", overrides), multi_agent)
    assert problem is not None and needle in problem


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


def run(run_id: int, cache_dir: str, replay: dict | None = None, **overrides) -> dict:
    cfg = build("async", deep_merge(CONFIG, overrides)).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"))
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE).remote(
        run_id, cfg, None, TOKEN, cache_dir, exit_when_done=False, confinement=confinement, replay=replay
    )
    try:
        out = ray.get(driver.run.remote(), timeout=240)
    finally:
        ray.kill(driver)
    out["series"] = {name: dict(points) for name, points in out["series"].items()}
    return out


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
    # The ledger too, but for where its untrained rows were when the run stopped: the
    # schedule ends with the last batch, and whether a call admitted before it had
    # returned by then (waiting) or not (in_flight) is the host's timing, in either run.
    assert untrained_merged(replayed["ledger"]) == untrained_merged(original["ledger"])


def untrained_merged(ledger: dict[str, float]) -> dict[str, float]:
    """`ledger` with its waiting and in-flight rows as one count."""
    out = dict(ledger)
    out["untrained"] = out.pop("ledger/waiting") + out.pop("ledger/in_flight")
    return out


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
    out = run(4603, cache_dir, replay=original["schedule"], sync={"update_mode": "in_flight"})
    assert out["state"] == "failed"
    assert "this run cannot be replayed: sync.update_mode 'in_flight'" in out["error"]
