"""HTML pages: login, runs list, run page (charts wired for live points), cancel, static."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders

from runs.models import Run
from workers.metric_names import DASHBOARD_CHARTS


@pytest.mark.parametrize("url", ["/", "/runs/new/", "/runs/1/"])
def test_pages_ask_anonymous_visitors_to_log_in(client, db, url):
    r = client.get(url)
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_a_user_logs_in_with_a_password(client, owner):
    r = client.post("/accounts/login/", {"username": "olga", "password": "pw-olga"})
    assert r.status_code == 302 and r["Location"] == "/"
    assert client.get("/").status_code == 200


def test_the_runs_list_shows_team_runs_with_status_and_live_hook(client_for, teammate, make_run):
    run = make_run(name="cap-4")
    html = client_for(teammate).get("/").content.decode()
    assert f'data-run-id="{run.pk}"' in html and "cap-4" in html
    assert 'class="status status-queued"' in html
    assert 'data-live-path="/ws/runs/"' in html


def test_the_runs_list_hides_other_teams_runs(client_for, outsider, make_run):
    make_run(name="secret-run")
    assert "secret-run" not in client_for(outsider).get("/").content.decode()


def test_the_run_page_has_a_chart_per_dashboard_chart(client_for, owner, run):
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    for title, series in DASHBOARD_CHARTS:
        assert f'data-chart="{title}"' in html
        assert f'data-series="{",".join(series)}"' in html
    assert html.count('data-points="0"') == len(DASHBOARD_CHARTS)
    assert f'data-live-path="/ws/runs/{run.pk}/"' in html
    assert "/static/plotly/plotly.min.js" in html
    assert 'id="cancel-button"' in html


def test_an_outsider_gets_404_for_a_run_page(client_for, outsider, run):
    assert client_for(outsider).get(f"/runs/{run.pk}/").status_code == 404


def test_the_cancel_button_cancels_and_returns_to_the_run(
    client_for, owner, run, enqueued, django_capture_on_commit_callbacks
):
    assert 'id="cancel-button"' in client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        r = client_for(owner).post(f"/runs/{run.pk}/cancel/")
    assert r.status_code == 302 and r["Location"] == f"/runs/{run.pk}/"
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLING
    assert enqueued == [("cancel_run", run.pk)]


def test_cancelling_a_finished_run_from_the_page_says_why_and_changes_nothing(client_for, owner, make_run, enqueued):
    run = make_run(status=Run.Status.SUCCEEDED)
    r = client_for(owner).post(f"/runs/{run.pk}/cancel/", follow=True)
    assert r.redirect_chain == [(f"/runs/{run.pk}/", 302)]
    assert f"run {run.pk} is succeeded; nothing to cancel" in r.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert enqueued == []


def test_a_member_sees_no_cancel_button_on_anothers_run_and_a_post_changes_nothing(client_for, teammate, run, enqueued):
    assert 'id="cancel-button"' not in client_for(teammate).get(f"/runs/{run.pk}/").content.decode()
    r = client_for(teammate).post(f"/runs/{run.pk}/cancel/", follow=True)
    assert "you need the admin role or higher (yours: member)" in r.content.decode()
    run.refresh_from_db()
    assert run.status != Run.Status.CANCELLING and enqueued == []


def test_an_outsider_cannot_cancel_from_the_page(client_for, outsider, run):
    assert client_for(outsider).post(f"/runs/{run.pk}/cancel/").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_plotly_comes_from_the_python_package_not_a_cdn(client, db):
    path = finders.find("plotly/plotly.min.js")
    assert path and path.endswith("plotly/package_data/plotly.min.js")
    assert finders.find("plotly/datasets/iris.csv.gz") is None  # only the JS is exposed
    r = client.get("/static/plotly/plotly.min.js")
    assert r.status_code == 200
    assert b"plotly" in b"".join(r.streaming_content)[:2000].lower()


def test_healthz_answers(client, db):
    assert client.get("/healthz").json() == {"ok": True}
