"""The MLflow export (runs/tracking.py): a run's config as params and its stored series
as metrics, read back from a local file store with MLflow's own client."""

from __future__ import annotations

import json
import shutil

import pytest

from runs import tracking
from runs.models import Experiment, MetricPoint, Run
from runs.tasks import export_run_metrics, finish_run_metrics
from teams.models import Team

mlflow = pytest.importorskip("mlflow", reason="the MLflow export needs the `mlflow` extra (pip install '.[mlflow]')")
from mlflow.tracking import MlflowClient  # noqa: E402

Status = Run.Status


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory):
    """An MLflow SQLite store with its tables made (a dozen seconds of migrations), once."""
    path = tmp_path_factory.mktemp("mlflow") / "empty.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(settings, tmp_path, monkeypatch, empty_store):
    """A store of its own the platform exports to, and MLflow's client on it."""
    path = tmp_path / "mlflow.db"
    shutil.copyfile(empty_store, path)
    settings.ROLLWAY_MLFLOW_TRACKING_URI = f"sqlite:///{path}"
    monkeypatch.setattr(tracking, "_last_asked", {})
    return MlflowClient(tracking_uri=settings.ROLLWAY_MLFLOW_TRACKING_URI)


def ingest(client, run, points):
    response = client.post(
        f"/api/runs/{run.pk}/metrics",
        data=json.dumps({"points": points}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert response.status_code == 200, response.content


def points(series, steps, base=0.0):
    return [{"series": series, "step": s, "value": base + s / 10, "time": 1763700000.0 + s} for s in steps]


def experiment_name(run) -> str:
    team = run.experiment.team
    return f"rollway/{team.pk}-{team.slug}/{run.experiment.name}"


def mlflow_run(store, run):
    [found] = store.search_runs(
        [store.get_experiment_by_name(experiment_name(run)).experiment_id],
        filter_string=f"tags.`rollway.run_id` = '{run.pk}'",
    )
    return found


def history(store, mlflow_id, key):
    return sorted((m.step, m.value, m.timestamp) for m in store.get_metric_history(mlflow_id, key))


def stored(run, series):
    return sorted(
        (step, value, int(t * 1000))
        for step, value, t in MetricPoint.objects.filter(run=run, series=series).values_list("step", "value", "time")
    )


def test_it_exports_the_config_as_params_and_the_series_as_metrics(
    store, run, client, enqueued, django_capture_on_commit_callbacks
):
    run.transition(Status.STARTING)
    run.transition(Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        ingest(client, run, points("reward/mean", range(0, 5)) + points("loss", range(0, 5), base=1.0))
    assert ("export_run_metrics", run.pk) in enqueued
    assert export_run_metrics(run.pk) == 10

    found = mlflow_run(store, run)
    assert found.info.run_name == run.name
    assert found.data.tags["rollway.preset"] == run.preset
    assert found.data.tags["rollway.team"] == run.experiment.team.name
    assert found.data.tags["rollway.team_id"] == str(run.experiment.team_id)
    params = found.data.params
    assert params["trainer.group_size"] == str(run.config["trainer"]["group_size"])
    assert set(params) == set(tracking.flatten(run.config))
    for series in ("reward/mean", "loss"):
        assert history(store, found.info.run_id, series) == stored(run, series)


def test_two_teams_of_one_name_never_share_an_mlflow_experiment(store, run, make_run, team):
    twin = Team.objects.create(name=team.name, slug=f"{team.slug}-2")  # names need not be unique
    theirs = make_run(experiment=Experiment.objects.create(team=twin, name=run.experiment.name))
    MetricPoint.objects.create(run=run, series="loss", step=0, value=1.0, time=1763700000.0)
    MetricPoint.objects.create(run=theirs, series="loss", step=0, value=2.0, time=1763700000.0)
    assert export_run_metrics(run.pk) == 1 and export_run_metrics(theirs.pk) == 1

    ours_in, theirs_in = (store.get_experiment_by_name(experiment_name(r)).experiment_id for r in (run, theirs))
    assert ours_in != theirs_in
    assert [r.data.tags["rollway.run_id"] for r in store.search_runs([ours_in])] == [str(run.pk)]
    assert [r.data.tags["rollway.run_id"] for r in store.search_runs([theirs_in])] == [str(theirs.pk)]
    assert store.get_experiment_by_name(f"{team.name}/{run.experiment.name}") is None


def test_later_points_follow_without_sending_earlier_ones_again(store, run, client):
    ingest(client, run, points("reward/mean", range(0, 3)))
    assert export_run_metrics(run.pk) == 3
    ingest(client, run, points("reward/mean", range(0, 3)))  # the reporter re-sends a batch
    ingest(client, run, points("reward/mean", range(3, 6)))
    assert export_run_metrics(run.pk) == 3
    assert export_run_metrics(run.pk) == 0
    assert history(store, mlflow_run(store, run).info.run_id, "reward/mean") == stored(run, "reward/mean")


def test_the_runs_end_sends_the_last_points_and_closes_the_mlflow_run(
    store, run, client, enqueued, django_capture_on_commit_callbacks
):
    run.transition(Status.STARTING)
    run.transition(Status.RUNNING)
    ingest(client, run, points("reward/mean", range(0, 2)))
    export_run_metrics(run.pk)
    ingest(client, run, points("reward/mean", range(2, 4)))  # within EXPORT_EVERY_S: not yet asked
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/api/runs/{run.pk}/status",
            data=json.dumps({"status": "succeeded"}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
        )
    assert response.status_code == 200
    assert ("finish_run_metrics", run.pk) in enqueued
    assert finish_run_metrics(run.pk) == 2

    found = mlflow_run(store, run)
    assert found.info.status == "FINISHED"
    assert history(store, found.info.run_id, "reward/mean") == stored(run, "reward/mean")


def test_ingest_asks_for_an_export_at_most_every_few_seconds(store, run, client, enqueued):
    for step in range(3):
        tracking.ask_export(run.pk)
        ingest(client, run, points("reward/mean", [step]))
    assert enqueued.count(("export_run_metrics", run.pk)) == 1
    tracking.ask_export(run.pk, final=True)
    assert ("finish_run_metrics", run.pk) in enqueued


def test_nothing_is_exported_without_a_tracking_uri(settings, run, client, enqueued):
    settings.ROLLWAY_MLFLOW_TRACKING_URI = ""
    tracking.ask_export(run.pk)
    assert not any(name.endswith("run_metrics") for name, _ in enqueued)
    assert export_run_metrics(run.pk) == 0


def test_flatten_names_nested_keys_with_dots_and_keeps_lists_as_json():
    assert tracking.flatten({"trainer": {"lr": 1e-6, "betas": [0.9, 0.99]}, "name": "x", "seed": None}) == {
        "trainer.lr": "1e-06",
        "trainer.betas": "[0.9, 0.99]",
        "name": "x",
        "seed": "null",
    }
