"""One team cannot starve the others (teams/quotas.py, runs/queue.py): each team's queued,
running and GPU quotas, the priority range of each role, and a queue whose teams take
turns whatever their runs' priorities."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from runs import actions, queue
from runs.models import Checkpoint, Experiment, Run
from teams.models import Membership, Team
from workers.config.presets import build
from workers.run.admission import Capacity

Status = Run.Status
GiB = 2**30


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture(autouse=True)
def no_sized_runs():
    queue._DEMANDS.clear()  # SQLite may give a new run an earlier test's id


@pytest.fixture
def viewer(team):
    user = get_user_model().objects.create_user("vera", password="pw-vera")
    Membership.objects.create(team=team, user=user, role=Membership.Role.VIEWER)
    return user


@pytest.fixture
def other_team(owner):
    team = Team.objects.create(name="Annex")
    Membership.objects.create(team=team, user=owner, role=Membership.Role.ADMIN)
    return team


@pytest.fixture
def other_experiment(other_team, owner):
    return Experiment.objects.create(team=other_team, name="e", created_by=owner)


def on_gpus(n: int) -> dict:
    """A run whose n inference workers and trainer ask for a GPU each (n + 1 GPUs)."""
    return build("async", {"inference": {"num_workers": n}, "placement": {"devices": "gpu"}}).model_dump(mode="json")


# --- the queued quota: refused at launch, clone, retry, resume and comparison ---------


def test_a_launch_past_the_teams_queued_quota_is_a_409_naming_the_quota_and_the_setting(
    client_for, teammate, experiment, make_run, settings, enqueued
):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 2
    make_run(), make_run()
    r = post_json(client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync"})
    assert r.status_code == 409
    assert r.json() == {
        "errors": {
            "team": "team Lab already has 2 queued runs (ROLLWAY_TEAM_MAX_QUEUED=2): "
            "wait for some to start or cancel some"
        }
    }
    assert Run.objects.count() == 2 and enqueued == []


def test_runs_scheduled_running_or_ended_leave_the_queued_quota_free(
    client_for, teammate, experiment, make_run, settings
):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    make_run(phase=queue.SCHEDULED)
    make_run(status=Status.RUNNING)
    make_run(status=Status.FAILED)
    first = post_json(client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync"})
    second = post_json(client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync"})
    assert (first.status_code, second.status_code) == (201, 409)


def test_a_site_admins_quota_for_the_team_replaces_the_default_and_is_named(
    client_for, teammate, team, experiment, make_run, settings
):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 100
    Team.objects.filter(pk=team.pk).update(max_queued_runs=1)
    make_run()
    r = post_json(client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync"})
    assert r.status_code == 409
    assert "team Lab's own max_queued_runs=1, set by a site admin" in r.json()["errors"]["team"]


def test_another_teams_full_queue_does_not_stop_a_launch(client_for, owner, other_experiment, make_run, settings):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    make_run()  # Lab's one queued run
    r = post_json(client_for(owner), "/api/runs", {"experiment": other_experiment.pk, "preset": "sync"})
    assert r.status_code == 201


def test_the_launch_form_shows_a_full_queue_beside_the_experiment(client_for, teammate, experiment, make_run, settings):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    make_run()
    r = client_for(teammate).post(
        "/runs/new/", {"experiment": experiment.pk, "preset": "sync", "name": "", "priority": "0"}
    )
    assert r.status_code == 409
    assert "ROLLWAY_TEAM_MAX_QUEUED=1" in r.content.decode() and Run.objects.count() == 1


def test_a_retry_a_resume_and_a_clone_past_the_quota_are_refused_and_create_nothing(
    client_for, owner, make_run, settings
):
    parent = make_run(
        Status.FAILED, preset="sync", config=build("sync", {"stop": {"max_steps": 9}}).model_dump(mode="json")
    )
    Checkpoint.objects.create(run=parent, step=3, location="/ck/3", bytes=1, sha256="ab" * 32)
    make_run()
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    api = client_for(owner)
    for path, body in [("retry", {}), ("resume", {"step": 3}), ("clone", {})]:
        r = post_json(api, f"/api/runs/{parent.pk}/{path}", body)
        assert r.status_code == 409, path
        assert "ROLLWAY_TEAM_MAX_QUEUED=1" in r.json()["errors"]["team"], path
    assert Run.objects.count() == 2


def test_a_comparison_that_would_pass_the_quota_queues_none_of_its_runs(client_for, owner, team, make_run, settings):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 4
    make_run()
    body = {"team": team.pk, "name": "c", "configurations": ["sync", "async"], "seeds": [1, 2]}
    r = post_json(client_for(owner), "/api/comparisons", body)
    assert r.status_code == 409
    assert r.json()["errors"]["team"] == (
        "team Lab has 1 queued runs and these 4 would make 5 (ROLLWAY_TEAM_MAX_QUEUED=4): "
        "wait for some to start or cancel some, or launch fewer"
    )
    assert Run.objects.count() == 1
    settings.ROLLWAY_TEAM_MAX_QUEUED = 5
    assert post_json(client_for(owner), "/api/comparisons", body).status_code == 201
    assert Run.objects.count() == 5


def test_a_simulation_takes_no_place_in_the_queue_so_a_full_one_does_not_stop_it(
    client_for, teammate, experiment, make_run, settings
):
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    make_run()
    body = {"experiment": experiment.pk, "preset": "sync", "cluster": {"gpus": 8}, "steps": 3}
    r = post_json(client_for(teammate), "/api/simulations", body)
    assert r.status_code == 201, r.json()


# --- the GPU quota: a run that could never fit is refused; one that must wait, waits ---


def test_a_run_asking_more_gpus_than_its_team_may_hold_is_refused_naming_the_quota(
    client_for, teammate, experiment, settings
):
    settings.ROLLWAY_TEAM_MAX_GPUS = 2
    overrides = {"inference": {"num_workers": 2}, "placement": {"devices": "gpu"}}
    r = post_json(
        client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "async", "overrides": overrides}
    )
    assert r.status_code == 400
    assert r.json()["errors"]["team"] == (
        "the run asks for 3 GPUs and team Lab may hold 2 at once (ROLLWAY_TEAM_MAX_GPUS=2): "
        "ask for fewer, or set placement.devices to 'cpu'"
    )
    assert not Run.objects.exists()


def test_a_reward_pools_gpus_count_toward_the_teams_gpu_quota(client_for, teammate, experiment, settings):
    settings.ROLLWAY_TEAM_MAX_GPUS = 2
    overrides = {"placement": {"devices": "gpu"}, "rewards": {"workers": 1, "gpus_per_worker": 1}}
    r = post_json(
        client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "async", "overrides": overrides}
    )
    assert r.status_code == 400
    assert r.json()["errors"]["team"].startswith("the run asks for 3 GPUs and team Lab may hold 2 at once")
    assert not Run.objects.exists()


def test_a_run_holding_reward_gpus_keeps_them_in_its_teams_count(schedule, driver, settings, make_run):
    settings.ROLLWAY_MAX_RUNNING = settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 5
    settings.ROLLWAY_TEAM_MAX_GPUS = 4
    driver.capacity = Capacity(cpus=16.0, memory_bytes=64 * GiB, gpus=8.0)
    pooled = build(
        "async", {"placement": {"devices": "gpu"}, "rewards": {"workers": 1, "gpus_per_worker": 1}}
    ).model_dump(mode="json")
    make_run(status=Status.RUNNING, config=pooled)  # 1 + 1 + 1 reward worker's: Lab holds 3 GPUs
    ours = make_run(config=on_gpus(1))
    assert schedule() == []
    ours.refresh_from_db()
    assert ours.waiting_for() == (
        "team Lab's active runs hold 3 GPUs and this run needs 2 more (ROLLWAY_TEAM_MAX_GPUS=4)"
    )


def test_a_run_past_its_teams_gpu_quota_waits_while_another_teams_starts(
    schedule, driver, settings, make_run, other_experiment
):
    settings.ROLLWAY_MAX_RUNNING = settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 5
    settings.ROLLWAY_TEAM_MAX_GPUS = 4
    driver.capacity = Capacity(cpus=16.0, memory_bytes=64 * GiB, gpus=8.0)
    make_run(status=Status.RUNNING, config=on_gpus(2))  # Lab holds 3 GPUs
    ours = make_run(config=on_gpus(1))  # 2 more would make 5
    theirs = make_run(config=on_gpus(2), experiment=other_experiment)
    assert schedule() == [theirs.pk]
    ours.refresh_from_db()
    assert ours.waiting_for() == (
        "team Lab's active runs hold 3 GPUs and this run needs 2 more (ROLLWAY_TEAM_MAX_GPUS=4)"
    )
    settings.ROLLWAY_TEAM_MAX_GPUS = 5
    assert schedule() == [ours.pk]


def test_a_team_at_its_own_running_quota_waits_and_the_run_page_says_why(
    schedule, settings, team, make_run, client_for, owner
):
    settings.ROLLWAY_MAX_RUNNING = settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 5
    Team.objects.filter(pk=team.pk).update(max_running_runs=1)
    make_run(status=Status.RUNNING)
    waiting = make_run()
    assert schedule() == []
    reason = "team Lab has 1 active run (team Lab's own max_running_runs=1, set by a site admin)"
    waiting.refresh_from_db()
    assert waiting.waiting_for() == reason
    assert reason.replace("'", "&#x27;") in client_for(owner).get(f"/runs/{waiting.pk}/").content.decode()


# --- the priority range of each role --------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "priority", "status"), [("teammate", 5, 201), ("teammate", 6, 400), ("owner", 10, 201)]
)
def test_each_role_may_give_priorities_in_its_own_range(request, client_for, experiment, persona, priority, status):
    user = request.getfixturevalue(persona)
    body = {"experiment": experiment.pk, "preset": "sync", "priority": priority}
    r = post_json(client_for(user), "/api/runs", body)
    assert r.status_code == status, r.json()
    if status == 400:
        assert r.json()["errors"] == {
            "priority": "the member role in team Lab may give a priority from -10 to 5 "
            "(ROLLWAY_MEMBER_MAX_PRIORITY=5), got 6"
        }
        assert not Run.objects.exists()


def test_the_operator_sets_each_roles_highest_priority(client_for, teammate, owner, experiment, settings):
    settings.ROLLWAY_MEMBER_MAX_PRIORITY = 0
    settings.ROLLWAY_ADMIN_MAX_PRIORITY = 3
    refused = post_json(
        client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync", "priority": 1}
    )
    assert "(ROLLWAY_MEMBER_MAX_PRIORITY=0), got 1" in refused.json()["errors"]["priority"]
    refused = post_json(client_for(owner), "/api/runs", {"experiment": experiment.pk, "preset": "sync", "priority": 4})
    assert refused.json()["errors"]["priority"] == (
        "the admin role in team Lab may give a priority from -10 to 3 (ROLLWAY_ADMIN_MAX_PRIORITY=3), got 4"
    )
    lowered = post_json(
        client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync", "priority": -10}
    )
    assert lowered.status_code == 201


def test_a_viewer_may_not_launch_at_any_priority(client_for, viewer, experiment):
    r = post_json(client_for(viewer), "/api/runs", {"experiment": experiment.pk, "preset": "sync", "priority": 0})
    assert r.status_code == 403 and "viewer" in r.json()["errors"]["experiment"]


def test_a_member_may_not_retry_or_clone_an_admins_run_at_a_priority_above_theirs(client_for, teammate, make_run):
    parent = make_run(Status.FAILED, preset="sync", priority=9)
    api = client_for(teammate)
    retried = post_json(api, f"/api/runs/{parent.pk}/retry", {})
    assert retried.status_code == 400 and "from -10 to 5" in retried.json()["errors"]["priority"]
    cloned = post_json(api, f"/api/runs/{parent.pk}/clone", {})
    assert cloned.status_code == 400 and "from -10 to 5" in cloned.json()["errors"]["priority"]
    assert post_json(api, f"/api/runs/{parent.pk}/clone", {"priority": 5}).status_code == 201


def test_a_comparison_priority_above_the_roles_range_is_refused(client_for, teammate, team):
    body = {"team": team.pk, "name": "c", "configurations": ["sync"], "seeds": [1], "priority": 7}
    r = post_json(client_for(teammate), "/api/comparisons", body)
    assert r.status_code == 400 and "ROLLWAY_MEMBER_MAX_PRIORITY=5" in r.json()["errors"]["priority"]
    assert not Run.objects.exists()


# --- a queue fair across teams whatever the priorities --------------------------------


def test_one_teams_run_starts_within_one_slot_of_another_teams_fifty_at_top_priority(
    schedule, settings, make_run, other_experiment, django_capture_on_commit_callbacks
):
    settings.ROLLWAY_MAX_RUNNING = 1
    settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 50
    flood = [make_run(name=f"a{k}", priority=10) for k in range(50)]
    assert schedule() == [flood[0].pk]  # team A holds the one slot
    lone = make_run(name="b", priority=0, experiment=other_experiment)
    started_after_b_queued = []
    while lone.pk not in started_after_b_queued:
        # The slot frees: the active run ends, and the scheduler fills it.
        with django_capture_on_commit_callbacks(execute=True):
            for run in queue.active_runs():
                actions.do_set_run_status(run, Status.RUNNING)
                actions.do_set_run_status(run, Status.SUCCEEDED)
        [started] = schedule()
        started_after_b_queued.append(started)
    assert len(started_after_b_queued) <= 2, started_after_b_queued  # at most one of A's first


def test_a_team_with_a_run_active_yields_the_next_slot_to_a_team_with_none(
    schedule, settings, make_run, other_experiment
):
    settings.ROLLWAY_MAX_RUNNING = 2
    settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 50
    make_run(status=Status.RUNNING, priority=10)
    for k in range(5):
        make_run(name=f"a{k}", priority=10)
    lone = make_run(name="b", experiment=other_experiment)
    assert schedule() == [lone.pk]


# --- where the quotas are shown and set -----------------------------------------------


def test_the_api_and_the_teams_page_show_the_quotas_and_your_priority_range(client_for, teammate, team, settings):
    settings.ROLLWAY_TEAM_MAX_QUEUED, settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 30, 3
    Team.objects.filter(pk=team.pk).update(max_gpus=8)
    client = client_for(teammate)
    [shown] = client.get("/api/teams").json()["teams"]
    assert (shown["quotas"], shown["priority_range"]) == ({"queued": 30, "running": 3, "gpus": 8}, [-10, 5])
    page = client.get("/teams/").content.decode()
    assert "30 runs queued" in page and "3 active at once" in page and "8 GPUs held at once" in page
    assert "Priorities you may give: -10 to 5." in page


def test_only_a_superuser_changes_a_teams_quotas_in_the_django_admin(client_for, owner, team):
    from django.contrib.admin.sites import site
    from django.test import RequestFactory

    admin = site._registry[Team]
    request = RequestFactory().get("/")
    get_user_model().objects.filter(pk=owner.pk).update(is_staff=True)
    request.user = get_user_model().objects.get(pk=owner.pk)  # the team's admin, staff
    assert {"max_queued_runs", "max_running_runs", "max_gpus"} <= set(admin.get_readonly_fields(request, team))
    request.user = get_user_model().objects.create_superuser("root", password="pw-root")
    assert not {"max_queued_runs", "max_running_runs", "max_gpus"} & set(admin.get_readonly_fields(request, team))


@pytest.mark.django_db(transaction=True)
def test_the_last_place_in_the_queue_goes_to_one_launch_only(owner, experiment, settings):
    """do_launch_run reads the quota again under the team's row lock: a launch checked
    when a place was free is refused if another launch took it since."""
    settings.ROLLWAY_TEAM_MAX_QUEUED = 1
    launch = actions.check_launch(owner, experiment=experiment.pk, preset="sync")
    again = actions.check_launch(owner, experiment=experiment.pk, preset="sync")
    actions.do_launch_run(owner, launch, schedule=False)
    with pytest.raises(actions.Conflict), transaction.atomic():
        actions.do_launch_run(owner, again, schedule=False)
    assert Run.objects.count() == 1


# --- the settings ----------------------------------------------------------------------


def test_the_quota_and_priority_settings_default_as_documented(settings):
    import os

    env = {k for k in os.environ if k.startswith("ROLLWAY_")}
    defaults = {
        "ROLLWAY_TEAM_MAX_QUEUED": 100,
        "ROLLWAY_MAX_RUNNING_PER_TEAM": 2,
        "ROLLWAY_TEAM_MAX_GPUS": None,
        "ROLLWAY_MEMBER_MAX_PRIORITY": 5,
        "ROLLWAY_ADMIN_MAX_PRIORITY": 10,
    }
    assert {k: getattr(settings, k) for k in defaults.keys() - env} == {k: defaults[k] for k in defaults.keys() - env}


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ROLLWAY_TEAM_MAX_GPUS", "-1", "ROLLWAY_TEAM_MAX_GPUS must be a whole number ≥ 0 (got -1)"),
        ("ROLLWAY_MEMBER_MAX_PRIORITY", "11", "ROLLWAY_MEMBER_MAX_PRIORITY must be from -10 to 10 (got 11)"),
    ],
)
def test_a_bad_quota_or_priority_setting_stops_the_site_naming_it(tmp_path, name, value, says):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "ROLLWAY_HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "rollway.settings",
        "PYTHONPATH": os.pathsep.join([str(repo / "platform"), str(repo)]),
        name: value,
    }
    code = "import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and says in done.stderr
