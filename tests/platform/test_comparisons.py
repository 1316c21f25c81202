"""Comparison experiments: M configurations × N seeds launched as one, through the run
queue, and launched again without losing the runs they have."""

from __future__ import annotations

import json

import pytest

from compare import actions
from compare.models import Comparison
from configs.models import SavedConfig
from runs.models import Run
from teams.models import Team


@pytest.fixture
def saved(team, owner):
    return SavedConfig.objects.create(
        team=team, name="big-buffer", base_preset="async", overrides={"buffer": {"capacity": 4}}, created_by=owner
    )


def post(client, url, body):
    return client.post(url, json.dumps(body), content_type="application/json")


def test_a_3_configurations_by_2_seeds_comparison_queues_6_runs_with_their_configs_and_seeds(
    client_for, owner, experiment, saved, enqueued, django_capture_on_commit_callbacks
):
    body = {
        "experiment": experiment.pk,
        "name": "buffers",
        "configurations": ["async", "sync", f"saved:{saved.pk}"],
        "seeds": [0, 7],
        "overrides": {"trainer": {"lr": 3e-5}},
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client_for(owner), "/api/comparisons", body)

    assert response.status_code == 201, response.content
    comparison = Comparison.objects.get(pk=response.json()["id"])
    runs = list(comparison.runs.order_by("pk"))
    assert len(runs) == 6
    assert all(r.status == Run.Status.QUEUED and r.experiment_id == experiment.pk for r in runs)
    got = {(r.preset, r.config["seed"], r.config["buffer"]["capacity"], r.config["trainer"]["lr"]) for r in runs}
    from workers.config.presets import build

    want = set()
    for preset, capacity in (("async", None), ("sync", None), ("async", 4)):
        for seed in (0, 7):
            want.add((preset, seed, capacity or build(preset).buffer.capacity, 3e-5))
    assert got == want
    assert sum(1 for r in runs if r.saved_config_id == saved.pk) == 2
    # Seed-major: every configuration's first seed is queued before any second one.
    assert [(r.config["seed"], r.name.split(" · ")[1]) for r in runs] == [
        (seed, label) for seed in (0, 7) for label in ("async", "sync", "big-buffer v1")
    ]
    assert "buffers · big-buffer v1 · seed 7" in {r.name for r in runs}
    assert enqueued.count(("schedule_queue", None)) == 1  # one look at the queue decides for all six
    assert not [name for name, _ in enqueued if name == "launch_run"]
    assert comparison.seeds == [0, 7] and comparison.configurations == ["async", "sync", f"saved:{saved.pk}"]
    assert response.json()["compare_url"].endswith("runs=" + ",".join(str(r.pk) for r in runs))


def test_the_queue_schedules_a_comparisons_runs_within_its_limits(client_for, owner, experiment, driver, settings):
    from runs import queue

    settings.ROLLWAY_MAX_RUNNING = 2
    settings.ROLLWAY_MAX_RUNNING_PER_TEAM = 2
    body = {"experiment": experiment.pk, "name": "q", "configurations": ["async", "sync"], "seeds": [1, 2]}
    created = post(client_for(owner), "/api/comparisons", body).json()

    scheduled = queue.do_schedule_queue()

    assert len(scheduled) == 2  # the other two wait their turn like any queued run
    assert set(scheduled) < {r["id"] for r in created["runs"]}


def test_launching_again_adds_runs_and_keeps_the_old_ones(client_for, owner, experiment):
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "again", "configurations": ["async", "sync"], "seeds": [0, 1]}
    first = post(client, "/api/comparisons", body).json()
    old = {r["id"] for r in first["runs"]}

    same = post(client, f"/api/comparisons/{first['id']}/rerun", {})
    more = post(client, f"/api/comparisons/{first['id']}/rerun", {"seeds": [5]})

    assert same.status_code == 201 and more.status_code == 201
    comparison = Comparison.objects.get(pk=first["id"])
    ids = set(comparison.run_ids())
    assert old < ids and len(ids) == 4 + 4 + 2
    assert comparison.seeds == [0, 1, 5]
    assert sorted(Run.objects.filter(pk__in=more.json()["launched"]).values_list("config__seed", flat=True)) == [5, 5]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"configurations": ["async", "no-such-preset"]}, "configurations"),
        ({"configurations": []}, "configurations"),
        ({"seeds": [0, 1, 1]}, "seeds"),
        ({"seeds": [0, -1]}, "seeds"),
        ({"seeds": "zero"}, "seeds"),
        ({"seeds": []}, "seeds"),
        ({"configurations": ["async", "async"]}, "configurations"),
        ({"name": ""}, "name"),
        ({"overrides": {"trainer": {"lr": "fast"}}}, "trainer.lr"),  # as a single launch names it
        ({"overrides": [1]}, "overrides"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(client_for, owner, experiment, change, field):
    body = {"experiment": experiment.pk, "name": "bad", "configurations": ["async"], "seeds": [0], **change}
    response = post(client_for(owner), "/api/comparisons", body)

    assert response.status_code == 400
    assert field in response.json()["errors"], response.json()
    assert not Comparison.objects.exists() and not Run.objects.exists()


def test_more_runs_than_a_compare_page_shows_are_refused_on_seeds(client_for, owner, experiment):
    presets = ["async", "sync", "areal", "skyrl", "slime", "miles", "oat", "tunix", "roll", "art", "atropos"]
    body = {"experiment": experiment.pk, "name": "huge", "configurations": presets, "seeds": list(range(10))}
    response = post(client_for(owner), "/api/comparisons", body)

    assert response.status_code == 400
    assert "110 runs" in response.json()["errors"]["seeds"]
    assert not Run.objects.exists()


def test_another_teams_saved_configuration_is_refused_on_configurations(client_for, owner, experiment, outsider):
    theirs = SavedConfig.objects.create(team=Team.objects.get(name="Elsewhere"), name="x", base_preset="async")
    body = {"experiment": experiment.pk, "name": "peek", "configurations": [f"saved:{theirs.pk}"], "seeds": [0]}
    response = post(client_for(owner), "/api/comparisons", body)

    assert response.status_code == 400
    assert "no saved configuration" in response.json()["errors"]["configurations"]
    assert not Comparison.objects.exists()


def test_outsiders_get_404_for_a_comparison_its_rerun_and_its_page(client_for, owner, outsider, experiment):
    body = {"experiment": experiment.pk, "name": "private", "configurations": ["async"], "seeds": [0]}
    comparison_id = post(client_for(owner), "/api/comparisons", body).json()["id"]
    client = client_for(outsider)

    assert client.get(f"/api/comparisons/{comparison_id}").status_code == 404
    assert post(client, f"/api/comparisons/{comparison_id}/rerun", {}).status_code == 404
    assert client.get(f"/comparisons/{comparison_id}/").status_code == 404
    assert client.get("/api/comparisons").json() == {"comparisons": []}
    assert Run.objects.count() == 1


def test_the_list_shows_the_teams_comparisons_to_a_teammate(client_for, owner, teammate, experiment):
    body = {"experiment": experiment.pk, "name": "shared", "configurations": ["async"], "seeds": [0, 1]}
    post(client_for(owner), "/api/comparisons", body)

    listed = client_for(teammate).get("/api/comparisons").json()["comparisons"]

    assert [(c["name"], c["run_count"]) for c in listed] == [("shared", 2)]


def test_a_comparisons_page_is_the_compare_page_of_its_runs(client_for, owner, experiment):
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "page", "configurations": ["async", "sync"], "seeds": [0, 1]}
    created = post(client, "/api/comparisons", body).json()
    ids = [r["id"] for r in created["runs"]]

    page = client.get(f"/comparisons/{created['id']}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-runs="{",".join(map(str, ids))}"' in html
    for run_id in ids:
        assert f"#{run_id} " in html
    assert "Run again" in html


def test_rerun_with_duplicate_seeds_is_refused_and_adds_nothing(client_for, owner, experiment):
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "dup", "configurations": ["async"], "seeds": [0]}
    created = post(client, "/api/comparisons", body).json()

    response = post(client, f"/api/comparisons/{created['id']}/rerun", {"seeds": [3, 3]})

    assert response.status_code == 400 and "seeds" in response.json()["errors"]
    assert Run.objects.count() == 1


def test_check_seeds_reads_a_forms_comma_separated_seeds():
    assert actions.check_seeds("0, 1,2") == [0, 1, 2]


def test_the_admin_action_launches_a_comparison_again(client_for, owner, experiment):
    owner.is_staff = owner.is_superuser = True
    owner.save()
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "admin", "configurations": ["async", "sync"], "seeds": [0]}
    created = post(client, "/api/comparisons", body).json()

    response = client.post(
        "/admin/compare/comparison/",
        {"action": "launch_again", "_selected_action": [created["id"]]},
    )

    assert response.status_code == 302
    assert len(Comparison.objects.get(pk=created["id"]).run_ids()) == 4


def test_the_form_shows_a_bad_field_next_to_it_and_launches_nothing(client_for, owner, experiment):
    form = {"target": str(experiment.pk), "name": "f", "configurations": ["async"], "seeds": "1,1", "overrides": "{}"}

    response = client_for(owner).post("/comparisons/new/", form)

    assert response.status_code == 400
    assert 'data-field="seeds"' in response.content.decode()
    assert "seed 1 is given twice" in response.content.decode()
    assert not Run.objects.exists()


def test_the_form_lists_presets_and_the_teams_saved_configurations(client_for, owner, saved, outsider):
    theirs = SavedConfig.objects.create(team=Team.objects.get(name="Elsewhere"), name="theirs", base_preset="sync")

    html = client_for(owner).get("/comparisons/new/").content.decode()

    assert 'value="async"' in html and f'value="saved:{saved.pk}"' in html
    assert f'value="saved:{theirs.pk}"' not in html


def test_every_run_of_a_comparison_gets_its_priority_and_a_rerun_its_own(client_for, owner, experiment):
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "urgent", "configurations": ["async", "sync"], "seeds": [0, 1]}
    created = post(client, "/api/comparisons", {**body, "priority": 4})
    assert created.status_code == 201, created.content
    first = {r["id"] for r in created.json()["runs"]}
    assert sorted(Run.objects.filter(pk__in=first).values_list("priority", flat=True)) == [4, 4, 4, 4]

    again = post(client, f"/api/comparisons/{created.json()['id']}/rerun", {"priority": -1})
    assert again.status_code == 201, again.content
    added = Run.objects.filter(pk__in=again.json()["launched"])
    assert sorted(added.values_list("priority", flat=True)) == [-1, -1, -1, -1]


@pytest.mark.parametrize("priority", [11, "soon", 2.5])
def test_a_bad_comparison_priority_is_one_400_on_priority_and_queues_nothing(client_for, owner, experiment, priority):
    body = {"experiment": experiment.pk, "name": "x", "configurations": ["async", "sync"], "seeds": [0, 1]}
    r = post(client_for(owner), "/api/comparisons", {**body, "priority": priority})
    assert r.status_code == 400
    assert r.json()["errors"] == {"priority": r.json()["errors"]["priority"]}
    assert "from -10 to 10" in r.json()["errors"]["priority"]
    assert not Run.objects.exists() and not Comparison.objects.exists()


def test_the_form_sets_every_runs_priority_and_shows_a_bad_one_next_to_its_field(client_for, owner, experiment):
    client = client_for(owner)
    assert 'name="priority"' in client.get("/comparisons/new/").content.decode()
    form = {"target": str(experiment.pk), "name": "f", "configurations": ["async"], "seeds": "0,1", "overrides": "{}"}

    refused = client.post("/comparisons/new/", {**form, "priority": "11"})
    assert refused.status_code == 400
    assert 'data-field="priority"' in refused.content.decode() and not Run.objects.exists()

    assert client.post("/comparisons/new/", {**form, "priority": "3"}).status_code == 302
    assert sorted(Run.objects.values_list("priority", flat=True)) == [3, 3]
