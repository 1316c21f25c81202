"""HTML pages: login, runs list, run page (charts wired for live points), cancel, static."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.staticfiles import finders

from runs.models import Run
from workers.config.presets import build
from workers.core.metric_names import DASHBOARD_CHARTS, PER_RANK, reward_func_series


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
    one_process = [(title, series) for title, series in DASHBOARD_CHARTS if not set(series) & PER_RANK]
    for title, series in one_process:
        assert f'data-chart="{title}"' in html
        assert f'data-series="{",".join(series)}"' in html
    assert html.count('data-points="0"') == len(one_process)
    assert "Trainer ranks" not in html  # one trainer process: no per-rank charts
    assert f'data-live-path="/ws/runs/{run.pk}/"' in html
    assert "/static/plotly/plotly.min.js" in html
    assert 'id="cancel-button"' in html


@pytest.mark.parametrize(
    ("status", "said"),
    [("succeeded", "the run succeeded"), ("failed", "the run failed"), ("cancelled", "the run was cancelled")],
)
def test_a_finished_run_page_says_it_is_final_not_live(client_for, owner, make_run, status, said):
    ended = dt.datetime(2026, 11, 25, 9, 40, 12, tzinfo=dt.UTC)
    html = client_for(owner).get(f"/runs/{make_run(status, finished_at=ended).pk}/").content.decode()
    assert f'id="live-state" data-state="final">final — {said} at 2026-11-25 09:40 UTC</p>' in html
    assert 'data-state="connecting"' not in html and ">live<" not in html


@pytest.mark.parametrize("status", ["queued", "running", "cancelling"])
def test_an_unfinished_run_page_goes_live(client_for, owner, make_run, status):
    html = client_for(owner).get(f"/runs/{make_run(status).pk}/").content.decode()
    assert 'id="live-state" data-state="connecting">connecting…</p>' in html  # live.js: "live" once open
    assert "final —" not in html


def test_a_run_with_reward_functions_charts_each_functions_mean(client_for, owner, make_run):
    config = build("async").model_dump(mode="json")
    config["task"]["reward_funcs"] = ["my_rewards.gsm8k:accuracy", "my_rewards.gsm8k:formatReward"]
    run = make_run(config=config)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert 'data-chart="Reward functions"' in html
    long_name = reward_func_series("formatReward", "mean")  # not a valid series part as it is
    assert f'data-series="rewards/accuracy/mean,{long_name}"' in html and long_name.startswith("rewards/formatreward-")
    assert 'data-chart="Reward functions"' not in client_for(owner).get(f"/runs/{make_run().pk}/").content.decode()


def test_a_multi_agent_run_charts_each_agent_its_episodes_and_its_late_groups(client_for, owner, make_run):
    config = build("async", {"task": {"name": "propose_solve"}, "buffer": {"unit": "episode"}}).model_dump(mode="json")
    html = client_for(owner).get(f"/runs/{make_run(config=config).pk}/").content.decode()
    assert 'data-series="agent/proposer/reward_mean,agent/solver/reward_mean"' in html
    assert 'data-series="agent/proposer/p50_s,agent/proposer/p90_s,agent/solver/p50_s,agent/solver/p90_s"' in html
    assert 'data-series="episode/p50_s,episode/p90_s"' in html and 'data-series="buffer/late_groups"' in html
    single = client_for(owner).get(f"/runs/{make_run().pk}/").content.decode()
    assert "agent/" not in single and 'data-chart="Episode completion time (s)"' not in single


def test_the_mfu_chart_of_a_cpu_run_says_why_it_stays_empty(client_for, owner, make_run):
    note = "the trainer computes on the CPU, which has no peak to measure MFU against"
    cpu = client_for(owner).get(f"/runs/{make_run().pk}/").content.decode()
    assert f'data-series="trainer/mfu"\n             data-unit="fraction" data-empty="{note}"' in cpu
    config = build("async", {"placement": {"devices": "gpu"}}).model_dump(mode="json")
    gpu = client_for(owner).get(f"/runs/{make_run(config=config).pk}/").content.decode()
    assert 'data-series="trainer/mfu"\n             data-unit="fraction" data-empty=""' in gpu
    assert note not in gpu


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


def test_a_trainer_pools_run_page_draws_a_line_per_rank(client_for, owner, make_run):
    config = build("async", {"trainer": {"backend": "fsdp2", "num_ranks": 3}}).model_dump(mode="json")
    html = client_for(owner).get(f"/runs/{make_run(config=config).pk}/").content.decode()
    assert 'data-chart="Trainer ranks: busy fraction"' in html
    busy = ",".join(f"trainer/rank_busy_frac/{r}" for r in range(3))
    both = ",".join(
        [*(f"trainer/rank_compute_s/{r}" for r in range(3)), *(f"trainer/rank_comm_s/{r}" for r in range(3))]
    )
    assert f'data-series="{busy}"' in html and f'data-series="{both}"' in html
    assert 'data-unit="fraction"' in html and 'data-unit="bytes"' in html


def test_the_run_page_says_where_each_actor_runs(client_for, owner, make_run):
    placement = [
        {
            "actor": "trainer rank 1",
            "node_id": "ab" * 28,
            "node_ip": "10.0.0.5",
            "labels": {"pool": "train"},
            "gpu_ids": ["2"],
            "cuda_visible_devices": "2",
            "pid": 41,
            "threads": 8,
        },
        {
            "actor": "inference worker 0",
            "node_id": "cd" * 28,
            "node_ip": "10.0.0.4",
            "labels": {},
            "gpu_ids": [],
            "cuda_visible_devices": "",
            "pid": 42,
        },
    ]
    run = make_run(status=Run.Status.RUNNING, placement=placement)
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    table = html[html.index('<table id="placement">') : html.index("</table>", html.index('<table id="placement">'))]
    assert "<td>trainer rank 1</td><td>10.0.0.5</td><td>pool=train</td><td>2</td><td>8</td>" in table
    # An actor that reported no thread count (a driver of an earlier version; the buffer).
    assert "<td>inference worker 0</td><td>10.0.0.4</td><td>—</td><td>none</td><td>—</td>" in table
    assert f"<code>{'ab' * 6}</code>" in table


def test_a_run_not_yet_placed_shows_no_placement_table(client_for, owner, run):
    assert 'id="placement"' not in client_for(owner).get(f"/runs/{run.pk}/").content.decode()


LEDGER = {"drawn": 30, "trained": 24, "dropped_stale": 2, "dropped_uniform": 0, "waiting": 3, "requeued_waiting": 0}


@pytest.mark.parametrize(("in_flight", "verdict"), [(1, "Every row drawn is accounted for."), (0, "1 drawn rows are")])
def test_a_finished_runs_page_and_api_show_its_prompt_ledger(client_for, owner, make_run, in_flight, verdict):
    from runs.models import MetricPoint

    run = make_run(status=Run.Status.SUCCEEDED)
    client = client_for(owner)
    assert 'id="ledger"' not in client.get(f"/runs/{run.pk}/").content.decode()  # nothing reported yet
    assert client.get(f"/api/runs/{run.pk}").json()["ledger"] == {}
    totals = {**LEDGER, "in_flight": in_flight, "unaccounted": 1 - in_flight}
    MetricPoint.objects.upsert(run.pk, [(f"ledger/{k}", 8, float(v), 0.0) for k, v in totals.items()])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    table = html[html.index('<table id="ledger">') : html.index("</table>", html.index('<table id="ledger">'))]
    assert "<tr><td>rows drawn from the data or the task</td><td>30</td></tr>" in table
    assert "<tr><td>dropped as stale</td><td>2</td></tr>" in table
    assert f"<tr><td>being generated when the run stopped</td><td>{in_flight}</td></tr>" in table
    assert verdict in html
    assert client.get(f"/api/runs/{run.pk}").json()["ledger"] == totals
