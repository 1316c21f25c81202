"""The run list, page and API: filters, search, pages, sort, the latest-value columns and
sparklines computed by the database, and bulk cancel."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone

from runs.listing import MAX_PAGE_SIZE, SPARK_POINTS
from runs.models import Experiment, MetricPoint, Run

Status = Run.Status


def points(run, series, values, t0=1_763_700_000.0):
    MetricPoint.objects.upsert(run.pk, [(series, step, v, t0 + step) for step, v in enumerate(values, start=1)])


@pytest.fixture
def three(make_run, teammate, experiment):
    """A running async run with rewards, a finished sync run with more steps, a queued
    run by the teammate in another experiment."""
    now = timezone.now()
    a = make_run(Status.RUNNING, "async", name="alpha fast", started_at=now - dt.timedelta(seconds=60))
    points(a, "reward/mean", [0.1, 0.3, 0.5])
    points(a, "policy/version", [1, 2, 3])
    points(a, "samples/per_s", [100, 200, 300])
    b = make_run(
        Status.SUCCEEDED,
        "sync",
        name="beta slow",
        started_at=now - dt.timedelta(seconds=600),
        finished_at=now - dt.timedelta(seconds=100),
    )
    points(b, "reward/mean", [0.2, 0.9, 0.8, 0.7, 0.6])
    points(b, "policy/version", [1, 2, 3, 4, 5])
    points(b, "samples/per_s", [50, 50, 50, 50, 50])
    other = Experiment.objects.create(team=experiment.team, name="other")
    c = make_run(Status.QUEUED, "async", name="gamma", experiment=other)
    Run.objects.filter(pk=c.pk).update(launched_by=teammate)
    return a, b, c


def ids(response):
    assert response.status_code == 200, response.content
    return [r["id"] for r in response.json()["runs"]]


def test_the_api_lists_the_latest_values_of_each_run(client_for, owner, three):
    a, b, c = three
    rows = {r["id"]: r for r in client_for(owner).get("/api/runs").json()["runs"]}
    assert rows[a.pk]["latest_reward"] == 0.5
    assert rows[a.pk]["steps_done"] == 3
    assert rows[a.pk]["samples_per_s"] == 300
    assert rows[a.pk]["sparkline"] == [0.1, 0.3, 0.5]
    assert rows[b.pk]["duration_s"] == pytest.approx(500, abs=1)
    assert rows[c.pk]["steps_done"] is None and rows[c.pk]["sparkline"] == []
    # The running run's progress toward stop.max_steps, and a time left from its rate.
    max_steps = a.config["stop"]["max_steps"]
    expected = max(3 / max_steps, 60 / (a.config["stop"]["max_minutes"] * 60))
    assert rows[a.pk]["progress"] == pytest.approx(expected, abs=0.01)
    assert rows[a.pk]["eta_s"] > 0
    assert rows[b.pk]["progress"] is None  # finished: nothing left to estimate


def test_the_sparkline_keeps_only_the_last_points_in_step_order(client_for, owner, make_run):
    run = make_run(Status.RUNNING)
    points(run, "reward/mean", [i / 100 for i in range(SPARK_POINTS + 30)])
    [row] = client_for(owner).get("/api/runs").json()["runs"]
    assert row["sparkline"] == [i / 100 for i in range(30, SPARK_POINTS + 30)]


def test_the_sparkline_of_a_series_with_gaps_still_has_its_last_points(client_for, owner, make_run):
    run = make_run(Status.RUNNING)
    steps = [s for s in range(3 * SPARK_POINTS) if s % 3 or s > 2 * SPARK_POINTS]  # gaps early on
    MetricPoint.objects.upsert(run.pk, [("reward/mean", s, s / 1000, 1000.0 + s) for s in steps])
    [row] = client_for(owner).get("/api/runs").json()["runs"]
    assert row["sparkline"] == [s / 1000 for s in steps[-SPARK_POINTS:]]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ("status=running", ["a"]),
        ("status=running,queued", ["c", "a"]),
        ("preset=sync", ["b"]),
        ("launcher=tom", ["c"]),
        ("q=SLOW", ["b"]),
        ("q=a", ["c", "b", "a"]),
    ],
)
def test_the_api_filters_and_searches(client_for, owner, three, params, expected):
    by_name = dict(zip("abc", (r.pk for r in three), strict=True))
    assert ids(client_for(owner).get(f"/api/runs?{params}")) == [by_name[x] for x in expected]


def test_the_api_filters_by_experiment_and_date(client_for, owner, three):
    a, b, c = three
    client = client_for(owner)
    assert ids(client.get(f"/api/runs?experiment={c.experiment_id}")) == [c.pk]
    Run.objects.filter(pk=a.pk).update(created_at=timezone.now() - dt.timedelta(days=10))
    today = timezone.now().date()
    assert set(ids(client.get(f"/api/runs?created_from={today}"))) == {b.pk, c.pk}
    assert ids(client.get(f"/api/runs?created_to={today - dt.timedelta(days=5)}")) == [a.pk]


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("reward", ["a", "b", "c"]),  # ascending; runs without a value last
        ("-reward", ["b", "a", "c"]),
        ("-steps", ["b", "a", "c"]),
        ("-samples_per_s", ["a", "b", "c"]),
        ("name", ["a", "b", "c"]),
        ("-name", ["c", "b", "a"]),
        ("-duration", ["b", "a", "c"]),
        ("status", ["c", "a", "b"]),
    ],
)
def test_the_api_sorts_by_each_column(client_for, owner, three, sort, expected):
    by_name = dict(zip("abc", (r.pk for r in three), strict=True))
    assert ids(client_for(owner).get(f"/api/runs?sort={sort}")) == [by_name[x] for x in expected]


def test_pages_have_a_size_and_explicit_next_and_prev(client_for, owner, make_run):
    made = [make_run(name=f"run {i}").pk for i in range(5)]
    client = client_for(owner)
    first = client.get("/api/runs?page_size=2&sort=name").json()
    assert [r["id"] for r in first["runs"]] == made[:2]
    assert (first["total"], first["pages"], first["prev"]) == (5, 3, None)
    second = client.get(first["next"]).json()
    assert [r["id"] for r in second["runs"]] == made[2:4]
    assert "sort=name" in second["next"] and "page_size=2" in second["next"]
    assert [r["id"] for r in client.get(second["prev"]).json()["runs"]] == made[:2]
    last = client.get(second["next"]).json()
    assert [r["id"] for r in last["runs"]] == made[4:] and last["next"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ("status=sleeping", "status"),
        ("sort=colour", "sort"),
        (f"page_size={MAX_PAGE_SIZE + 1}", "page_size"),
        ("page=0", "page"),
        ("experiment=abc", "experiment"),
        ("created_from=yesterday", "created_from"),
    ],
)
def test_a_bad_list_parameter_is_a_400_naming_it(client_for, owner, params, field):
    r = client_for(owner).get(f"/api/runs?{params}")
    assert r.status_code == 400
    assert field in r.json()["errors"]


def test_outsiders_see_none_of_the_teams_runs(client_for, outsider, three):
    assert ids(client_for(outsider).get("/api/runs")) == []


def test_a_list_of_200_runs_costs_a_few_queries(client_for, owner, make_run, django_assert_max_num_queries):
    for i in range(200):
        run = make_run(Status.RUNNING if i % 2 else Status.SUCCEEDED, name=f"run {i}")
        points(run, "reward/mean", [0.1 * (k % 10) for k in range(60)])
        points(run, "policy/version", list(range(1, 61)))
    client = client_for(owner)
    # Session and user lookups, the count, the page, its tags, the sparklines.
    with django_assert_max_num_queries(7):
        body = client.get("/api/runs?page_size=200").json()
    assert len(body["runs"]) == 200 and all(len(r["sparkline"]) == SPARK_POINTS for r in body["runs"])
    with django_assert_max_num_queries(13):  # plus the filters' choices
        page = client.get("/?page_size=200")
    assert page.content.decode().count('<svg class="spark"') == 200


def test_the_page_filters_sorts_and_pages_from_the_url(client_for, owner, three):
    a, b, c = three
    client = client_for(owner)
    page = client.get("/?status=running").content.decode()
    assert f'data-run-id="{a.pk}"' in page
    assert f'data-run-id="{b.pk}"' not in page and f'data-run-id="{c.pk}"' not in page
    sorted_page = client.get("/?sort=-reward&page_size=1").content.decode()
    assert f'data-run-id="{b.pk}"' in sorted_page and f'data-run-id="{a.pk}"' not in sorted_page
    assert "page=2" in sorted_page and "sort=-reward" in sorted_page  # the next link keeps the state
    bad = client.get("/?sort=colour")
    assert bad.status_code == 400 and "sort by one of" in bad.content.decode()


def test_runs_lists_the_runs_as_the_home_page_does(client_for, owner, three):
    """/runs/<id>/ has a parent a reader can reach by trimming the URL."""
    a, b, c = three
    client = client_for(owner)
    page = client.get("/runs/?status=running")
    assert page.status_code == 200
    assert f'data-run-id="{a.pk}"' in page.content.decode()
    assert f'data-run-id="{b.pk}"' not in page.content.decode()
    assert client.get("/").status_code == 200


# --- bulk cancel -------------------------------------------------------------------


def test_bulk_cancel_cancels_what_it_may_and_says_why_not_for_the_rest(client_for, owner, outsider, make_run, enqueued):
    running = make_run(Status.RUNNING)
    queued = make_run(Status.QUEUED)
    finished = make_run(Status.SUCCEEDED)
    foreign_experiment = Experiment.objects.get(name="theirs")
    foreign = make_run(Status.RUNNING, experiment=foreign_experiment)
    r = client_for(owner).post(
        "/api/runs/cancel",
        data=json.dumps({"runs": [running.pk, queued.pk, finished.pk, foreign.pk]}),
        content_type="application/json",
    )
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["cancelled"] == [running.pk, queued.pk]
    assert set(body["refused"]) == {str(finished.pk), str(foreign.pk)}
    assert "succeeded" in body["refused"][str(finished.pk)]
    assert "not found" in body["refused"][str(foreign.pk)]
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert statuses[running.pk] == statuses[queued.pk] == Status.CANCELLING
    assert (statuses[finished.pk], statuses[foreign.pk]) == (Status.SUCCEEDED, Status.RUNNING)


@pytest.mark.parametrize("runs", [[], "1,2", [1, "x"], [True], None])
def test_bulk_cancel_refuses_a_bad_list_naming_the_field(client_for, owner, runs):
    r = client_for(owner).post("/api/runs/cancel", data=json.dumps({"runs": runs}), content_type="application/json")
    assert r.status_code == 400
    assert "runs" in r.json()["errors"]


def test_the_page_cancels_the_checked_runs_and_returns_to_the_list(client_for, owner, make_run, enqueued):
    running, finished = make_run(Status.RUNNING), make_run(Status.SUCCEEDED)
    r = client_for(owner).post(
        "/runs/cancel/", {"runs": [running.pk, finished.pk], "next": "/?status=running"}, follow=True
    )
    assert r.redirect_chain[-1][0] == "/?status=running"
    text = r.content.decode()
    assert f"Cancelling #{running.pk}" in text
    assert f"#{finished.pk} not cancelled" in text
    running.refresh_from_db()
    assert running.status == Status.CANCELLING


def test_the_page_never_redirects_off_site(client_for, owner, make_run, enqueued):
    run = make_run(Status.RUNNING)
    r = client_for(owner).post("/runs/cancel/", {"runs": [run.pk], "next": "//evil.example/"})
    assert r.status_code == 302 and r["Location"] == "/"
