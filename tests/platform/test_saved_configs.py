"""Saved configurations: a team's named, versioned preset + overrides, listed beside the
read-only built-in presets, launched like a preset, and never edited in place."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.utils.html import escape

from configs.models import SavedConfig
from runs.models import Run
from workers.config.presets import PRESETS, build, deep_merge

URL = "/api/configs"
OVERRIDES = {"buffer": {"capacity": 4}, "stop": {"max_steps": 50}}


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def saved(client_for, owner, team):
    r = post_json(
        client_for(owner),
        URL,
        {"team": team.slug, "name": "wide buffer", "base_preset": "async", "overrides": OVERRIDES},
    )
    assert r.status_code == 201, r.content
    return SavedConfig.objects.get(pk=r.json()["id"])


# --- saving -----------------------------------------------------------------------------


def test_a_member_saves_a_configuration_as_version_1_with_its_effective_config(client_for, owner, team):
    r = post_json(
        client_for(owner),
        URL,
        {
            "team": team.pk,
            "name": "wide buffer",
            "description": "async with room for four batches",
            "base_preset": "async",
            "overrides": OVERRIDES,
        },
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["kind"], body["version"], body["read_only"], body["created_by"]) == ("saved", 1, False, "olga")
    assert body["config"] == build("async", OVERRIDES).model_dump(mode="json")
    stored = SavedConfig.objects.get()
    assert (stored.team, stored.name, stored.base_preset, stored.overrides) == (team, "wide buffer", "async", OVERRIDES)


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"buffer": {"capacity": 0}}, "buffer.capacity", "greater than or equal to 1"),
        ({"buffer": {"capacit": 4}}, "buffer.capacit", "unknown field 'capacit'"),
        ({"stop": {"max_steps": 10**9}}, "stop.max_steps", "ROLLWAY_MAX_STEPS"),
        ([1, 2], "overrides", "must be a JSON object"),
    ],
)
def test_invalid_overrides_are_refused_by_field_and_nothing_is_stored(client_for, owner, team, overrides, field, says):
    r = post_json(
        client_for(owner), URL, {"team": team.pk, "name": "bad", "base_preset": "async", "overrides": overrides}
    )
    assert r.status_code == 400
    assert says in r.json()["errors"][field]
    assert not SavedConfig.objects.exists()


def test_the_launch_and_the_save_refuse_the_same_overrides_with_the_same_messages(client_for, owner, team, experiment):
    bad = {"buffer": {"capacity": 0, "mode": "ring"}, "trainer": {"lr": -1}}
    saved = post_json(
        client_for(owner), URL, {"team": team.pk, "name": "bad", "base_preset": "async", "overrides": bad}
    )
    launched = post_json(
        client_for(owner), "/api/runs", {"experiment": experiment.pk, "preset": "async", "overrides": bad}
    )
    assert saved.status_code == launched.status_code == 400
    assert saved.json()["errors"] == launched.json()["errors"]


def test_an_unknown_base_preset_or_a_missing_name_is_refused_naming_the_field(client_for, owner, team):
    r = post_json(client_for(owner), URL, {"team": team.pk, "name": "  ", "base_preset": "verl-9000"})
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert "choose a built-in preset" in errors["base_preset"]
    assert "1 to 100 characters" in errors["name"]
    assert not SavedConfig.objects.exists()


def test_a_second_configuration_with_a_taken_name_is_a_conflict_pointing_at_versions(client_for, owner, team, saved):
    r = post_json(client_for(owner), URL, {"team": team.pk, "name": "wide buffer", "base_preset": "sync"})
    assert r.status_code == 409
    assert f"/api/configs/{saved.pk}/versions" in r.json()["errors"]["name"]
    assert SavedConfig.objects.count() == 1


def test_an_outsider_cannot_save_into_another_team(client_for, outsider, team):
    r = post_json(client_for(outsider), URL, {"team": team.slug, "name": "mine now", "base_preset": "async"})
    assert r.status_code == 400
    assert "not a member" in r.json()["errors"]["team"]
    assert not SavedConfig.objects.exists()


# --- versions ---------------------------------------------------------------------------


def test_editing_saves_version_2_and_a_run_of_version_1_still_points_at_version_1(
    client_for, owner, experiment, saved, enqueued
):
    client = client_for(owner)
    launched = post_json(client, "/api/runs", {"experiment": experiment.pk, "saved_config": saved.pk})
    assert launched.status_code == 201, launched.content

    r = post_json(client, f"{URL}/{saved.pk}/versions", {"overrides": {"buffer": {"capacity": 6}}})
    assert r.status_code == 201, r.content
    v2 = SavedConfig.objects.get(pk=r.json()["id"])
    assert (v2.name, v2.version, v2.base_preset, v2.overrides) == (
        "wide buffer",
        2,
        "async",
        {"buffer": {"capacity": 6}},
    )

    run = Run.objects.get(pk=launched.json()["id"])
    assert run.saved_config == saved
    assert run.config["buffer"]["capacity"] == 4
    saved.refresh_from_db()
    assert (saved.version, saved.overrides) == (1, OVERRIDES)
    assert launched.json()["saved_config"] == {"id": saved.pk, "name": "wide buffer", "version": 1}
    detail = client.get(f"{URL}/{v2.pk}").json()
    assert [v["version"] for v in detail["versions"]] == [2, 1]


def test_a_new_version_of_an_old_version_still_numbers_after_the_newest(client_for, owner, saved):
    client = client_for(owner)
    post_json(client, f"{URL}/{saved.pk}/versions", {"description": "two"})
    r = post_json(client, f"{URL}/{saved.pk}/versions", {"description": "three"})
    assert r.json()["version"] == 3
    assert r.json()["overrides"] == OVERRIDES  # kept from the version it was made from


def test_an_invalid_edit_is_refused_by_field_and_adds_no_version(client_for, owner, saved):
    r = post_json(client_for(owner), f"{URL}/{saved.pk}/versions", {"overrides": {"buffer": {"capacity": -2}}})
    assert r.status_code == 400
    assert "buffer.capacity" in r.json()["errors"]
    assert SavedConfig.objects.count() == 1


def test_a_saved_version_a_run_ran_cannot_be_deleted_on_its_own(owner, experiment, saved):
    from django.db.models import RestrictedError

    Run.objects.create(
        experiment=experiment, name="r", preset="async", config={}, launched_by=owner, saved_config=saved
    )
    with pytest.raises(RestrictedError):
        saved.delete()
    saved.team.delete()  # the team's cascade takes runs and configurations together
    assert not SavedConfig.objects.exists()


# --- built-in presets --------------------------------------------------------------------


def test_built_in_presets_are_listed_read_only_beside_the_teams_configurations(client_for, owner, saved):
    configs = client_for(owner).get(URL).json()["configs"]
    builtins = [c for c in configs if c["kind"] == "preset"]
    assert [c["name"] for c in builtins] == list(PRESETS)
    assert all(c["read_only"] for c in builtins)
    assert [c["rewards_where"] for c in builtins] == [p["rewards_where"] for p in PRESETS.values()]
    assert client_for(owner).get(f"{URL}/oat").json()["rewards_where"] == PRESETS["oat"]["rewards_where"]
    [mine] = [c for c in configs if c["kind"] == "saved"]
    assert (mine["id"], mine["read_only"], mine["latest"]) == (saved.pk, False, True)


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_a_built_in_preset_cannot_be_edited(client_for, owner, preset):
    r = post_json(client_for(owner), f"{URL}/{preset}/versions", {"overrides": {"buffer": {"capacity": 4}}})
    assert r.status_code == 409
    assert "read-only" in r.json()["errors"]["config"]
    assert not SavedConfig.objects.exists()


def test_a_configuration_may_not_take_a_built_in_presets_name(client_for, owner, team):
    r = post_json(client_for(owner), URL, {"team": team.pk, "name": "async", "base_preset": "async"})
    assert r.status_code == 400
    assert "built-in preset" in r.json()["errors"]["name"]


def test_a_built_in_preset_is_readable_by_name(client_for, owner):
    body = client_for(owner).get(f"{URL}/sync").json()
    assert (body["kind"], body["read_only"], body["config"]["mode"]) == ("preset", True, "sync")


# --- launching ---------------------------------------------------------------------------


def test_launching_a_saved_configuration_gives_the_config_of_its_preset_and_overrides(
    client_for, owner, experiment, saved, enqueued
):
    extra = {"stop": {"max_minutes": 3}}
    r = post_json(
        client_for(owner), "/api/runs", {"experiment": experiment.pk, "saved_config": saved.pk, "overrides": extra}
    )
    assert r.status_code == 201, r.content
    run = Run.objects.get()
    assert run.config == build("async", deep_merge(OVERRIDES, extra)).model_dump(mode="json")
    # preset + overrides alone rebuild the config
    assert build(run.preset, run.overrides).model_dump(mode="json") == run.config
    assert run.saved_config == saved


def test_launching_by_saved_configuration_alone_uses_its_teams_default_experiment(
    client_for, owner, team, saved, enqueued
):
    r = post_json(client_for(owner), "/api/runs", {"saved_config": saved.pk})
    assert r.status_code == 201, r.content
    run = Run.objects.get()
    assert (run.experiment.team, run.experiment.name) == (team, "default")


def test_a_preset_and_a_saved_configuration_together_are_refused(client_for, owner, experiment, saved):
    r = post_json(
        client_for(owner), "/api/runs", {"experiment": experiment.pk, "saved_config": saved.pk, "preset": "sync"}
    )
    assert r.status_code == 400
    assert "not both" in r.json()["errors"]["preset"]
    assert not Run.objects.exists()


def test_an_outsider_can_neither_see_nor_launch_another_teams_configuration(client_for, outsider, saved):
    client = client_for(outsider)
    assert client.get(f"{URL}/{saved.pk}").status_code == 404
    assert not [c for c in client.get(URL).json()["configs"] if c["kind"] == "saved"]
    assert post_json(client, f"{URL}/{saved.pk}/versions", {}).status_code == 404
    r = post_json(client, "/api/runs", {"saved_config": saved.pk})
    assert r.status_code == 400
    assert f"no saved configuration {saved.pk} in your teams" in r.json()["errors"]["saved_config"]
    assert "wide buffer" not in client.get("/runs/new/").content.decode()
    assert "wide buffer" not in client.get("/configs/").content.decode()
    assert not Run.objects.exists()


def test_a_configuration_launches_only_into_its_own_teams_experiments(client_for, owner, saved, outsider):
    from runs.models import Experiment
    from teams.models import Membership

    elsewhere = Experiment.objects.get(name="theirs")
    Membership.objects.create(team=elsewhere.team, user=owner)
    r = post_json(client_for(owner), "/api/runs", {"experiment": elsewhere.pk, "saved_config": saved.pk})
    assert r.status_code == 400
    assert "belongs to team Lab" in r.json()["errors"]["saved_config"]


# --- pages -------------------------------------------------------------------------------


def test_the_launch_form_lists_presets_and_the_teams_configurations_in_two_groups(client_for, owner, saved):
    page = client_for(owner).get("/runs/new/").content.decode()
    assert '<optgroup label="Built-in presets">' in page
    assert '<optgroup label="Lab configurations">' in page
    assert f'<option value="saved:{saved.pk}"' in page
    assert page.index("Built-in presets") < page.index("Lab configurations")


def test_the_form_saves_its_preset_and_overrides_as_a_configuration_then_a_new_version(client_for, owner, experiment):
    client = client_for(owner)
    form = {
        "experiment": str(experiment.pk),
        "preset": "sync",
        "overrides": json.dumps(OVERRIDES),
        "config_name": "sync wide",
        "action": "save",
    }
    r = client.post("/runs/new/", form)
    v1 = SavedConfig.objects.get()
    assert r.status_code == 302 and r.url.endswith(f"?preset=saved:{v1.pk}")
    assert (v1.base_preset, v1.overrides, v1.version) == ("sync", OVERRIDES, 1)

    # saved again from the saved configuration itself: its overrides with the form's on top
    client.post("/runs/new/", {**form, "preset": f"saved:{v1.pk}", "overrides": '{"trainer": {"lr": 0.001}}'})
    v2 = SavedConfig.objects.get(version=2)
    assert (v2.name, v2.base_preset) == ("sync wide", "sync")
    assert v2.overrides == deep_merge(OVERRIDES, {"trainer": {"lr": 0.001}})
    assert not Run.objects.exists()


def test_the_form_refuses_a_save_with_bad_overrides_next_to_the_fields(client_for, owner, experiment):
    r = client_for(owner).post(
        "/runs/new/",
        {
            "experiment": str(experiment.pk),
            "preset": "async",
            "overrides": '{"buffer": {"capacity": 0}}',
            "config_name": "",
            "action": "save",
        },
    )
    assert r.status_code == 400
    page = r.content.decode()
    assert 'data-field="buffer.capacity"' in page and 'data-field="config_name"' in page
    assert not SavedConfig.objects.exists()


def test_the_form_launches_a_saved_configuration(client_for, owner, experiment, saved, enqueued):
    r = client_for(owner).post(
        "/runs/new/", {"experiment": str(experiment.pk), "preset": f"saved:{saved.pk}", "overrides": "{}"}
    )
    run = Run.objects.get()
    assert r.status_code == 302
    assert (run.saved_config, run.preset, run.config["buffer"]["capacity"]) == (saved, "async", 4)


def test_the_configurations_page_lists_each_version(client_for, owner, saved):
    client = client_for(owner)
    v2 = post_json(client, f"{URL}/{saved.pk}/versions", {"description": "bigger"}).json()["id"]
    page = client.get("/configs/").content.decode()
    assert "Lab configurations" in page and "wide buffer" in page
    assert re.findall(r'data-config-id="(\d+)"', page) == [str(v2), str(saved.pk)]  # newest first
    assert all(escape(p["rewards_where"]) in page for p in PRESETS.values())  # beside each built-in preset


# --- admin -------------------------------------------------------------------------------


@pytest.fixture
def staff(owner):
    owner.is_staff = True
    owner.save()
    return owner


def test_the_admin_lists_saved_configurations_and_the_built_in_presets(client_for, db, saved):
    admin = get_user_model().objects.create_superuser("root", password="pw-root")
    client = client_for(admin)
    changelist = client.get("/admin/configs/savedconfig/").content.decode()
    assert "wide buffer" in changelist and "Built-in presets (read-only)" in changelist
    presets = client.get("/admin/configs/savedconfig/presets/").content.decode()
    assert all(name in presets for name in PRESETS)
    assert all(escape(p["rewards_where"]) in presets for p in PRESETS.values())


def test_staff_see_only_their_teams_configurations_in_the_admin(client_for, staff, saved, outsider):
    from django.contrib.auth.models import Permission

    other = SavedConfig.objects.create(team=outsider.memberships.get().team, name="elsewhere only", base_preset="sync")
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="savedconfig"))
    changelist = client_for(staff).get("/admin/configs/savedconfig/").content.decode()
    assert "wide buffer" in changelist and "elsewhere only" not in changelist
    assert client_for(staff).get(f"/admin/configs/savedconfig/{other.pk}/change/").status_code in (302, 404)


def test_an_existing_version_is_read_only_in_the_admin(client_for, db, saved):
    admin = get_user_model().objects.create_superuser("root", password="pw-root")
    client = client_for(admin)
    client.post(
        f"/admin/configs/savedconfig/{saved.pk}/change/",
        {"team": saved.team_id, "name": "renamed", "base_preset": "sync", "overrides": "{}"},
    )
    saved.refresh_from_db()
    assert (saved.name, saved.base_preset) == ("wide buffer", "async")


def test_the_admin_refuses_invalid_overrides_naming_the_config_field(client_for, db, team):
    admin = get_user_model().objects.create_superuser("root", password="pw-root")
    r = client_for(admin).post(
        "/admin/configs/savedconfig/add/",
        {"team": team.pk, "name": "bad", "base_preset": "async", "overrides": '{"buffer": {"capacity": 0}}'},
    )
    assert r.status_code == 200
    assert "buffer.capacity" in r.content.decode()
    assert not SavedConfig.objects.exists()
