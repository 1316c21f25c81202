"""Retry, resume, clone, notes and tags (runs/lineage.py), and the checkpoint ingest:
each makes a new run linked to its parent and never touches the parent's history; each
is checked against roles like a launch, and lands in the audit log."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from runs import reconcile
from runs.models import Checkpoint, Experiment, MetricPoint, Run, RunSchedule
from teams.models import AuditEvent, Membership, Team
from workers.config.presets import build, deep_merge

Status = Run.Status
SHA = "ab" * 32


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def ingest_checkpoint(client, run, step, *, pruned=(), token=None):
    return client.post(
        f"/api/runs/{run.pk}/checkpoints",
        data=json.dumps(
            {"step": step, "location": f"/ck/run-{run.pk}/step-{step:08d}", "bytes": 1000 + step, "sha256": SHA}
            | ({"pruned": list(pruned)} if pruned else {})
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token or run.ingest_token}",
    )


@pytest.fixture
def viewer(team):
    user = get_user_model().objects.create_user("vera", password="x")
    Membership.objects.create(team=team, user=user, role=Membership.Role.VIEWER)
    return user


def test_the_engine_records_checkpoints_and_their_pruning(client, make_run):
    run = make_run(Status.RUNNING)
    assert ingest_checkpoint(client, run, 2).status_code == 201
    assert ingest_checkpoint(client, run, 4).status_code == 201
    # keep_last=2: step 6 prunes step 2
    response = ingest_checkpoint(client, run, 6, pruned=[f"/ck/run-{run.pk}/step-00000002"])
    assert response.status_code == 201 and response.json()["step"] == 6
    assert list(run.checkpoints.values_list("step", flat=True)) == [6, 4]
    # a resend is idempotent
    assert ingest_checkpoint(client, run, 6).status_code == 201
    assert run.checkpoints.count() == 2


def test_checkpoint_ingest_refuses_a_wrong_token_and_bad_bodies(client, make_run):
    run = make_run(Status.RUNNING)
    assert ingest_checkpoint(client, run, 2, token="nope").status_code == 401
    bad = client.post(
        f"/api/runs/{run.pk}/checkpoints",
        data=json.dumps({"step": -1, "location": "", "bytes": 1, "sha256": "xyz"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert bad.status_code == 400
    assert {"step", "location", "sha256"} <= set(bad.json()["errors"])
    assert not Checkpoint.objects.exists()


def test_retry_makes_a_linked_run_with_the_same_config(client_for, owner, make_run, enqueued):
    parent = make_run(Status.FAILED, overrides={"buffer": {"capacity": 3}}, priority=4)
    response = client_for(owner).post(f"/runs/{parent.pk}/retry/")
    child = Run.objects.exclude(pk=parent.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    assert (child.parent_id, child.origin, child.status) == (parent.pk, "retry", Status.QUEUED)
    assert child.config == parent.config and child.overrides == parent.overrides and child.priority == 4
    assert AuditEvent.objects.filter(action="retry", subject=f"run {parent.pk}").exists()
    parent.refresh_from_db()
    assert parent.status == Status.FAILED  # untouched


def test_children_keep_the_parents_trackers_less_those_the_site_turned_off(client_for, owner, make_run, settings):
    settings.ROLLWAY_MLFLOW_TRACKING_URI, settings.ROLLWAY_TENSORBOARD_DIR = "sqlite:///unused.db", "/tmp/unused-tb"
    parent = make_run(Status.FAILED, preset="sync", trackers=["mlflow", "tensorboard"])
    api = client_for(owner)
    assert post_json(api, f"/api/runs/{parent.pk}/retry", {}).json()["trackers"] == ["mlflow", "tensorboard"]
    settings.ROLLWAY_MLFLOW_TRACKING_URI = ""  # turned off since: a clone is not refused for it
    cloned = post_json(api, f"/api/runs/{parent.pk}/clone", {})
    assert cloned.status_code == 201 and cloned.json()["trackers"] == ["tensorboard"]


def test_retry_of_a_running_run_is_a_conflict_and_a_viewer_may_not(client_for, owner, viewer, make_run):
    running = make_run(Status.RUNNING)
    response = client_for(owner).post(f"/runs/{running.pk}/retry/", follow=True)
    assert "cancel it first" in response.content.decode()
    failed = make_run(Status.FAILED)
    response = client_for(viewer).post(f"/runs/{failed.pk}/retry/", follow=True)
    assert "you need the member role" in response.content.decode()
    assert Run.objects.count() == 2


SCHEDULE = {
    "admissions": [[0, 0, 2], [1, 0, 2]],
    "batches": [[0, ["w0-0", "w1-0", "w0-1", "w1-1"]]],
    "loads": [[1, 0, 3, 1]],
    "requeues": [[0, 0, ["w1-1"]]],
}


# What a run that recorded SCHEDULE ran with: two workers, batches of four groups, weights
# loaded inside calls, stale prompts requeued.
RECORDED = {
    "inference": {"num_workers": 2},
    "trainer": {"batch_groups": 4},
    "sync": {"update_mode": "in_flight"},
    "buffer": {"on_stale": "requeue"},
}


def with_schedule(run: Run) -> Run:
    """`run`, its config the one SCHEDULE was recorded under, with SCHEDULE kept."""
    run.config = deep_merge(run.config, RECORDED)
    run.save(update_fields=["config"])
    RunSchedule.objects.create(run=run, **SCHEDULE, bytes=80, steps=1)
    return run


def test_replay_makes_a_linked_run_that_launches_under_the_parents_schedule(client_for, owner, make_run, driver):
    from runs import in_ray, queue

    parent = with_schedule(make_run(Status.SUCCEEDED, preset="async", priority=2))
    page = client_for(owner).get(f"/runs/{parent.pk}/").content.decode()
    assert 'id="replay-button"' in page
    response = post_json(client_for(owner), f"/api/runs/{parent.pk}/replay", {})
    assert response.status_code == 201, response.content
    child = Run.objects.get(pk=response.json()["id"])
    assert (child.parent_id, child.origin, child.status, child.priority) == (parent.pk, "replay", Status.QUEUED, 2)
    assert child.config == parent.config and child.name.endswith("(replay)")
    assert AuditEvent.objects.filter(action="replay", subject=f"run {parent.pk}").exists()
    Run.objects.filter(pk=child.pk).update(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(child.pk)
    assert driver.replayed == {child.pk: SCHEDULE}  # the driver follows the parent's schedule
    retry = post_json(client_for(owner), f"/api/runs/{parent.pk}/retry", {}).json()["id"]
    Run.objects.filter(pk=retry).update(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(retry)
    assert driver.replayed[retry] is None  # a retry follows its own timing


@pytest.mark.parametrize(
    ("status", "schedule", "overrides", "field", "words"),
    [
        (Status.FAILED, True, {}, "status", "only a run that succeeded"),
        (Status.SUCCEEDED, False, {}, "schedule", "recorded no schedule"),
        (Status.SUCCEEDED, True, {"buffer": {"unit": "episode"}}, "config", "buffer.unit 'episode'"),
        # A config the record could not have come from (its workers' calls, its loads).
        (Status.SUCCEEDED, "one worker", {}, "schedule", "inference.num_workers is 1: set it to 2"),
        (Status.SUCCEEDED, "drain", {}, "schedule", "sync.update_mode 'drain' loads them only between calls"),
    ],
)
def test_a_run_that_cannot_be_replayed_is_a_409_naming_why_and_shows_no_button(
    client_for, owner, make_run, status, schedule, overrides, field, words
):
    config = build("async", overrides).model_dump(mode="json")
    parent = make_run(status, config=config)
    if schedule:
        with_schedule(parent)
    if schedule == "one worker":
        parent.config["inference"]["num_workers"] = 1
    if schedule == "drain":
        parent.config["sync"]["update_mode"] = "drain"
    parent.save(update_fields=["config"])
    response = post_json(client_for(owner), f"/api/runs/{parent.pk}/replay", {})
    assert response.status_code == 409
    assert words in response.json()["errors"][field]
    assert Run.objects.count() == 1
    assert 'id="replay-button"' not in client_for(owner).get(f"/runs/{parent.pk}/").content.decode()


def test_a_resumed_runs_replay_resumes_from_its_checkpoint_and_follows_its_record(
    client, client_for, owner, make_run, driver
):
    from runs import in_ray, queue
    from runs.lineage import do_resume

    original = make_run(Status.FAILED, preset="async")
    assert ingest_checkpoint(client, original, 3).status_code == 201
    resumed = do_resume(owner, original, original.checkpoints.get(step=3))
    Run.objects.filter(pk=resumed.pk).update(status=Status.SUCCEEDED)
    resumed.refresh_from_db()
    resumed.config = deep_merge(resumed.config, RECORDED)
    resumed.save(update_fields=["config"])
    # Its record starts where it resumed: the batch of step 4 trains version 3.
    recorded = {**SCHEDULE, "batches": [[3, SCHEDULE["batches"][0][1]]]}
    RunSchedule.objects.create(run=resumed, **recorded, bytes=80, steps=1)
    assert 'id="replay-button"' in client_for(owner).get(f"/runs/{resumed.pk}/").content.decode()
    response = post_json(client_for(owner), f"/api/runs/{resumed.pk}/replay", {})
    assert response.status_code == 201, response.content
    child = Run.objects.get(pk=response.json()["id"])
    assert (child.origin, child.parent_id, child.resume_from.step) == ("replay", resumed.pk, 3)
    Run.objects.filter(pk=child.pk).update(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(child.pk)
    assert driver.resumed_from[child.pk] == f"/ck/run-{original.pk}/step-00000003"
    assert driver.replayed[child.pk] == recorded
    # A record that does not start at the checkpoint's step, and a checkpoint no longer kept.
    RunSchedule.objects.filter(run=resumed).update(batches=[[2, SCHEDULE["batches"][0][1]]])
    response = post_json(client_for(owner), f"/api/runs/{resumed.pk}/replay", {})
    assert response.status_code == 409
    assert "the checkpoint it would resume from is of step 3" in response.json()["errors"]["schedule"]
    original.checkpoints.all().delete()
    response = post_json(client_for(owner), f"/api/runs/{resumed.pk}/replay", {})
    assert response.status_code == 409
    assert "the checkpoint of step 2, which the site no longer keeps" in response.json()["errors"]["resume_from"]
    assert 'id="replay-button"' not in client_for(owner).get(f"/runs/{resumed.pk}/").content.decode()


def test_a_replay_whose_parents_schedule_is_gone_fails_saying_so(client_for, owner, make_run, driver):
    from runs import in_ray, queue

    parent = with_schedule(make_run(Status.SUCCEEDED))
    child = Run.objects.get(pk=post_json(client_for(owner), f"/api/runs/{parent.pk}/replay", {}).json()["id"])
    RunSchedule.objects.filter(run=parent).delete()
    Run.objects.filter(pk=child.pk).update(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(child.pk)
    child.refresh_from_db()
    assert child.status == Status.FAILED and "schedule is gone" in child.error, child.error
    assert not driver.named("launch")


def test_a_viewer_may_not_replay_and_the_page_form_queues_a_replay(client_for, owner, viewer, make_run, enqueued):
    parent = with_schedule(make_run(Status.SUCCEEDED))
    response = client_for(viewer).post(f"/runs/{parent.pk}/replay/", follow=True)
    assert "you need the member role" in response.content.decode() and Run.objects.count() == 1
    response = client_for(owner).post(f"/runs/{parent.pk}/replay/")
    child = Run.objects.exclude(pk=parent.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    assert child.origin == "replay"


def trained(run: Run, values: dict[str, list[float]]) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, series=series, step=step, value=v, time=float(step))
        for series, vs in values.items()
        for step, v in enumerate(vs, start=1)
    )


def test_a_replays_page_compares_its_trained_series_with_the_originals_step_by_step(client_for, owner, make_run):
    parent = with_schedule(make_run(Status.SUCCEEDED))
    # A clock series (not trained) differs in any two runs and is left out.
    trained(parent, {"loss": [0.5, 0.25, 0.125], "reward/mean": [0.1, 0.2, 0.3], "trainer/tokens_per_s": [9, 9, 9]})
    same = make_run(Status.SUCCEEDED, parent=parent, origin=Run.Origin.REPLAY)
    trained(same, {"loss": [0.5, 0.25, 0.125], "reward/mean": [0.1, 0.2, 0.3], "trainer/tokens_per_s": [7, 7, 7]})
    compared = client_for(owner).get(f"/api/runs/{same.pk}").json()["replay"]
    assert compared["original"] == parent.pk and compared["bit_for_bit"] is True
    assert [r["series"] for r in compared["series"]] == ["loss", "reward/mean"]
    assert compared["series"][0] == {
        "series": "loss",
        "original_steps": 3,
        "replay_steps": 3,
        "compared": 3,
        "largest_gap": 0.0,
        "first_differs": None,
    }
    page = client_for(owner).get(f"/runs/{same.pk}/").content.decode()
    assert f"Equal to run #{parent.pk} at every step of every trained series: bit for bit." in page
    assert f'href="/compare/?runs={parent.pk},{same.pk}"' in page

    drifted = make_run(Status.SUCCEEDED, parent=parent, origin=Run.Origin.REPLAY)
    trained(drifted, {"loss": [0.5, 0.25, 0.1], "reward/mean": [0.1, 0.2, 0.3]})
    compared = client_for(owner).get(f"/api/runs/{drifted.pk}").json()["replay"]
    loss = compared["series"][0]
    assert compared["bit_for_bit"] is False
    assert (loss["first_differs"], loss["largest_gap"]) == (3, pytest.approx(0.025))
    page = client_for(owner).get(f"/runs/{drifted.pk}/").content.decode()
    assert f"Differs from run #{parent.pk}: loss from step 3 (largest |difference| 0.025)." in page

    short = make_run(Status.SUCCEEDED, parent=parent, origin=Run.Origin.REPLAY)
    trained(short, {"loss": [0.5, 0.25], "reward/mean": [0.1, 0.2]})
    assert client_for(owner).get(f"/api/runs/{short.pk}").json()["replay"]["bit_for_bit"] is False
    page = client_for(owner).get(f"/runs/{short.pk}/").content.decode()
    assert "Equal at every step both have, but the steps differ (loss: 2 here, 3 there;" in page
    Run.objects.filter(pk=short.pk).update(status=Status.RUNNING)
    assert "at every step both have so far." in client_for(owner).get(f"/runs/{short.pk}/").content.decode()

    # A retry of the same run, a replay whose original is now another team's run (whose
    # points its readers may not read), or whose original is gone, compares nothing.
    retry = make_run(Status.SUCCEEDED, parent=parent, origin=Run.Origin.RETRY)
    assert client_for(owner).get(f"/api/runs/{retry.pk}").json()["replay"] is None
    assert 'id="replay-verdict"' not in client_for(owner).get(f"/runs/{retry.pk}/").content.decode()
    elsewhere = Experiment.objects.create(team=Team.objects.create(name="Elsewhere"), name="theirs", created_by=owner)
    Run.objects.filter(pk=parent.pk).update(experiment=elsewhere)
    assert client_for(owner).get(f"/api/runs/{same.pk}").json()["replay"] is None
    parent.delete()
    assert client_for(owner).get(f"/api/runs/{same.pk}").json()["replay"] is None


def test_resume_continues_from_a_checkpoint_and_leaves_the_parent_alone(
    client, client_for, owner, make_run, driver, enqueued
):
    parent = make_run(Status.CANCELLED, config=build("sync", {"stop": {"max_steps": 10}}).model_dump(mode="json"))
    MetricPoint.objects.upsert(parent.pk, [("reward/mean", s, 0.1 * s, 1.0) for s in range(1, 6)])
    for step in (2, 4):
        assert ingest_checkpoint(client, parent, step).status_code == 201
    response = client_for(owner).post(f"/runs/{parent.pk}/resume/")
    child = Run.objects.exclude(pk=parent.pk).get()
    assert response.status_code == 302
    assert (child.origin, child.parent_id, child.resume_from.step) == ("resume", parent.pk, 4)
    # the queue schedules it and the launch hands the checkpoint's location to the engine
    from runs import in_ray, queue

    queue.do_schedule_queue()
    in_ray.do_start_in_ray(child.pk)
    assert driver.resumed_from[child.pk] == f"/ck/run-{parent.pk}/step-00000004"
    # an earlier checkpoint by step
    client_for(owner).post(f"/runs/{parent.pk}/resume/", {"step": "2"})
    assert Run.objects.filter(parent=parent, resume_from__step=2).exists()
    parent.refresh_from_db()
    assert parent.status == Status.CANCELLED and parent.points.count() == 5 and parent.checkpoints.count() == 2


def test_resume_without_a_checkpoint_or_at_an_unknown_step_is_refused(client_for, owner, make_run):
    parent = make_run(Status.FAILED)
    response = client_for(owner).post(f"/runs/{parent.pk}/resume/", follow=True)
    assert "no checkpoint to resume from" in response.content.decode()
    Checkpoint.objects.create(run=parent, step=3, location="/x", bytes=1, sha256=SHA)
    response = client_for(owner).post(f"/runs/{parent.pk}/resume/", {"step": "7"}, follow=True)
    assert "no checkpoint at step 7 (it has: 3)" in response.content.decode()
    assert Run.objects.count() == 1


def test_clone_opens_the_form_prefilled_and_records_the_parent(client_for, owner, make_run, experiment):
    parent = make_run(Status.SUCCEEDED, preset="sync", overrides={"buffer": {"capacity": 3}})
    client = client_for(owner)
    page = client.get(f"/runs/new/?clone={parent.pk}").content.decode()
    assert f'name="clone_of" value="{parent.pk}"' in page and "&quot;capacity&quot;: 3" in page
    response = client.post(
        "/runs/new/",
        {
            "clone_of": str(parent.pk),
            "experiment": str(experiment.pk),
            "preset": "sync",
            "name": "edited",
            "overrides": json.dumps({"buffer": {"capacity": 5}}),
        },
    )
    child = Run.objects.exclude(pk=parent.pk).get()
    assert response.status_code == 302
    assert (child.origin, child.parent_id, child.config["buffer"]["capacity"]) == ("clone", parent.pk, 5)
    assert AuditEvent.objects.filter(action="clone").exists()


def test_notes_and_tags_by_role_and_the_tag_filter(client_for, owner, teammate, viewer, make_run):
    mine = make_run(Status.SUCCEEDED, launched_by=teammate, name="mine")
    other = make_run(Status.SUCCEEDED, name="other")
    member = client_for(teammate)
    member.post(f"/runs/{mine.pk}/notes/", {"notes": "lr too high?", "tags": "baseline, lr-sweep"})
    mine.refresh_from_db()
    assert mine.notes == "lr too high?" and mine.tag_names() == ["baseline", "lr-sweep"]
    # a member may not annotate someone else's run, a viewer none; an admin any
    assert (
        "you need the admin role"
        in member.post(f"/runs/{other.pk}/notes/", {"notes": "x"}, follow=True).content.decode()
    )
    client_for(viewer).post(f"/runs/{mine.pk}/notes/", {"notes": "x"})
    client_for(owner).post(f"/runs/{other.pk}/notes/", {"tags": "baseline"})
    mine.refresh_from_db()
    assert mine.notes == "lr too high?"
    listed = client_for(viewer).get("/api/runs?tag=baseline").json()["runs"]
    assert sorted(r["id"] for r in listed) == sorted([mine.pk, other.pk])
    assert [r["id"] for r in client_for(viewer).get("/api/runs?tag=lr-sweep").json()["runs"]] == [mine.pk]
    bad = member.post(f"/runs/{mine.pk}/notes/", {"tags": "ok ../etc"}, follow=True).content.decode()
    assert "a tag is 1 to 40" in bad
    # retagging replaces the set
    member.post(f"/runs/{mine.pk}/notes/", {"tags": "final"})
    assert mine.tag_names() == ["final"]


def test_reconcile_resumes_a_dead_run_with_restarts_left_and_fails_one_without(make_run, driver, enqueued):
    config = build("sync", {"stop": {"max_steps": 10}, "checkpoint": {"every_steps": 2, "max_restarts": 1}})
    dead = make_run(Status.RUNNING, config=config.model_dump(mode="json"))
    Checkpoint.objects.create(run=dead, step=4, location="/ck/4", bytes=1, sha256=SHA)
    counts = reconcile.do_reconcile_runs()
    dead.refresh_from_db()
    child = Run.objects.get(parent=dead)
    assert counts["resumed"] == 1 and dead.status == Status.FAILED
    assert f"resumed as run {child.pk} from its checkpoint at step 4" in dead.error
    assert (child.origin, child.restarts, child.resume_from.step) == ("resume", 1, 4)
    # the child dies too: its one restart is used, so it fails as lost
    Run.objects.filter(pk=child.pk).update(status=Status.RUNNING)
    Checkpoint.objects.create(run=child, step=6, location="/ck/6", bytes=1, sha256=SHA)
    counts = reconcile.do_reconcile_runs()
    child.refresh_from_db()
    assert counts["lost"] == 1 and child.status == Status.FAILED and "is gone" in child.error
    assert not Run.objects.filter(parent=child).exists()


def report_failure(client, run, kind):
    return post_json_token(
        client,
        run,
        "status",
        {"status": "failed", "error": "The run lost a node: 10.0.0.5 left the cluster.", "error_kind": kind},
    )


def post_json_token(client, run, path, body):
    return client.post(
        f"/api/runs/{run.pk}/{path}",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def test_a_run_that_lost_a_node_is_resumed_while_restarts_are_left(client, make_run, enqueued):
    config = build("async", {"checkpoint": {"every_steps": 2, "max_restarts": 1}}).model_dump(mode="json")
    run = make_run(Status.RUNNING, config=config)
    Checkpoint.objects.create(run=run, step=4, location="/ck/4", bytes=1, sha256=SHA)
    assert report_failure(client, run, "node_lost").status_code == 200
    run.refresh_from_db()
    child = Run.objects.get(parent=run)
    assert run.status == Status.FAILED
    assert run.error == (
        f"The run lost a node: 10.0.0.5 left the cluster. It was resumed as run {child.pk} from its checkpoint "
        "at step 4 (restart 1 of checkpoint.max_restarts=1)."
    )
    assert (child.origin, child.restarts, child.resume_from.step, child.status) == ("resume", 1, 4, Status.QUEUED)
    # its one restart used: the child losing a node too stays failed
    Run.objects.filter(pk=child.pk).update(status=Status.RUNNING)
    child.issue_ingest_token()  # its driver's, as its launch issues it
    Checkpoint.objects.create(run=child, step=6, location="/ck/6", bytes=1, sha256=SHA)
    report_failure(client, child, "node_lost")
    child.refresh_from_db()
    assert child.status == Status.FAILED and "resumed" not in child.error
    assert not Run.objects.filter(parent=child).exists()


def test_a_run_the_watchdog_stopped_is_resumed_while_restarts_are_left(client, make_run, enqueued):
    config = build("async", {"checkpoint": {"every_steps": 2, "max_restarts": 2}}).model_dump(mode="json")
    run = make_run(Status.RUNNING, config=config)
    Checkpoint.objects.create(run=run, step=6, location="/ck/6", bytes=1, sha256=SHA)
    message = "The inference worker 0 has been in its generate for 412 s, past its deadline of 300 s."
    failure = {"kind": "hang", "message": message, "actor": "inference worker 0", "operation": "generate"}
    body = {"status": "failed", "error": message, "failure": failure}
    assert post_json_token(client, run, "status", body).status_code == 200
    run.refresh_from_db()
    child = Run.objects.get(parent=run)
    assert run.status == Status.FAILED and run.failure["kind"] == "hang"
    assert run.error.endswith(f"It was resumed as run {child.pk} from its checkpoint at step 6 (restart 1 of "
                              "checkpoint.max_restarts=2).")  # fmt: skip
    assert (child.origin, child.restarts, child.resume_from.step) == ("resume", 1, 6)


@pytest.mark.parametrize(
    ("kind", "restarts", "checkpoint"),
    [("actor_error", 1, True), ("node_lost", 0, True), ("node_lost", 1, False)],
    ids=["a failure of its own", "no restart allowed", "no checkpoint"],
)
def test_a_failure_is_not_resumed_unless_it_lost_a_node_with_a_restart_and_a_checkpoint(
    client, make_run, enqueued, kind, restarts, checkpoint
):
    config = build("async", {"checkpoint": {"every_steps": 2, "max_restarts": restarts}}).model_dump(mode="json")
    run = make_run(Status.RUNNING, config=config)
    if checkpoint:
        Checkpoint.objects.create(run=run, step=4, location="/ck/4", bytes=1, sha256=SHA)
    report_failure(client, run, kind)
    run.refresh_from_db()
    assert run.status == Status.FAILED and "resumed" not in run.error
    assert not Run.objects.filter(parent=run).exists()


def test_an_unknown_failure_kind_is_a_400_naming_the_field(client, make_run):
    r = report_failure(client, make_run(Status.RUNNING), "meteor")
    assert r.status_code == 400 and "error_kind" in r.json()["errors"]


def test_the_api_retries_resumes_clones_and_annotates(client, client_for, owner, make_run, enqueued):
    api = client_for(owner)
    parent = make_run(
        Status.FAILED, preset="sync", config=build("sync", {"stop": {"max_steps": 9}}).model_dump(mode="json")
    )
    assert ingest_checkpoint(client, parent, 3).status_code == 201
    listed = api.get(f"/api/runs/{parent.pk}/checkpoints").json()["checkpoints"]
    assert [(c["step"], c["bytes"], c["sha256"]) for c in listed] == [(3, 1003, SHA)]

    retried = post_json(api, f"/api/runs/{parent.pk}/retry", {})
    assert retried.status_code == 201 and (retried.json()["parent"], retried.json()["origin"]) == (parent.pk, "retry")
    resumed = post_json(api, f"/api/runs/{parent.pk}/resume", {"step": 3})
    assert resumed.status_code == 201 and resumed.json()["resume_from"]["step"] == 3
    assert post_json(api, f"/api/runs/{parent.pk}/resume", {"step": 5}).json()["errors"]["step"].endswith("(it has: 3)")
    cloned = post_json(api, f"/api/runs/{parent.pk}/clone", {"overrides": {"buffer": {"capacity": 6}}})
    assert cloned.status_code == 201 and cloned.json()["config"]["buffer"]["capacity"] == 6
    bad = post_json(api, f"/api/runs/{parent.pk}/clone", {"overrides": {"buffer": {"capacity": -1}}})
    assert bad.status_code == 400 and "buffer.capacity" in bad.json()["errors"]
    noted = post_json(api, f"/api/runs/{parent.pk}/notes", {"notes": "see #12", "tags": ["a", "b"]})
    assert noted.status_code == 200 and (noted.json()["notes"], noted.json()["tags"]) == ("see #12", ["a", "b"])
    children = api.get(f"/api/runs/{parent.pk}").json()["children"]
    assert [c["origin"] for c in children] == ["retry", "resume", "clone"]
