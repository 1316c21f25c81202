"""A run's driver log from its page, the JSON API and `rollway logs` (runs/logs.py): the
file the driver appends to under ROLLWAY_RUN_LOG_DIR, its end cut to whole lines, the
whole file as a download, and a 404 that says why when the file is not here."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from rollway_cli import errors
from rollway_cli.main import main
from runs import logs
from runs.models import Run
from teams import tokens
from teams.models import Membership


@pytest.fixture
def log_dir(settings, tmp_path):
    settings.ROLLWAY_RUN_LOG_DIR = str(tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    return tmp_path / "logs"


def write_log(log_dir, run: Run, text: str | bytes) -> None:
    path = log_dir / f"run-{run.pk}.log"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


LINES = "".join(f"2026-01-02 03:04:{i % 60:02d} INFO workers.run.driver: run 1: line {i}\n" for i in range(20_000))


def test_the_api_gives_a_short_log_whole(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.RUNNING)
    write_log(log_dir, run, "first line\nsecond line\n")
    response = client_for(owner).get(f"/api/runs/{run.pk}/log")
    assert response.status_code == 200
    assert response.json() == {
        "run": run.pk,
        "status": "running",
        "size": 23,
        "offset": 0,
        "truncated": False,
        "text": "first line\nsecond line\n",
    }


def test_the_api_gives_a_long_logs_end_in_whole_lines(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.FAILED)
    write_log(log_dir, run, LINES)
    size = len(LINES.encode())
    assert size > logs.TAIL_BYTES  # the point of the test
    data = client_for(owner).get(f"/api/runs/{run.pk}/log").json()
    assert data["size"] == size and data["truncated"]
    assert data["text"] == LINES.encode()[data["offset"] :].decode()
    assert size - data["offset"] <= logs.TAIL_BYTES
    assert data["text"].startswith("2026-01-02") and data["text"].endswith("line 19999\n")
    assert LINES.encode()[data["offset"] - 1 : data["offset"]] == b"\n"  # a whole first line

    small = client_for(owner).get(f"/api/runs/{run.pk}/log?tail_bytes=100").json()
    assert small["text"].endswith("line 19999\n") and small["text"].count("\n") == 1
    refused = client_for(owner).get(f"/api/runs/{run.pk}/log?tail_bytes=0")
    assert refused.status_code == 400 and "tail_bytes must be ≥ 1" in refused.json()["errors"]["tail_bytes"]


def test_a_log_that_is_not_utf8_is_shown_with_replacements_not_an_error(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.RUNNING)
    write_log(log_dir, run, b"ok \xff\xfe bytes\n")
    assert client_for(owner).get(f"/api/runs/{run.pk}/log").json()["text"] == "ok \ufffd\ufffd bytes\n"


def test_the_download_is_the_whole_file(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.SUCCEEDED)
    write_log(log_dir, run, LINES)
    response = client_for(owner).get(f"/api/runs/{run.pk}/log/download")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-driver.log"'
    assert b"".join(response.streaming_content) == LINES.encode()


def test_a_missing_log_is_a_404_that_says_why(log_dir, make_run, client_for, owner, settings):
    queued, gone = make_run(), make_run(status=Run.Status.SUCCEEDED)
    client = client_for(owner)
    for path in (f"/api/runs/{queued.pk}/log", f"/api/runs/{queued.pk}/log/download"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json() == {
            "errors": {"run": f"run {queued.pk} is queued: its driver has not started, so there is no log yet"}
        }
    response = client.get(f"/api/runs/{gone.pk}/log")
    assert response.status_code == 404
    why = response.json()["errors"]["run"]
    assert why.startswith(f"run {gone.pk}'s driver log (run-{gone.pk}.log) is not on this host:")
    settings.ROLLWAY_RUN_LOG_DIR = ""
    response = client.get(f"/api/runs/{gone.pk}/log")
    assert response.status_code == 404 and "ROLLWAY_RUN_LOG_DIR is empty" in response.json()["errors"]["run"]


def test_whoever_may_see_the_run_may_read_its_log_and_no_one_else(
    log_dir, make_run, client_for, team, outsider, teammate
):
    run = make_run(status=Run.Status.RUNNING)
    write_log(log_dir, run, "secret line\n")
    viewer = get_viewer(team)
    for user in (teammate, viewer):
        assert client_for(user).get(f"/api/runs/{run.pk}/log").json()["text"] == "secret line\n"
        assert client_for(user).get(f"/runs/{run.pk}/log/").status_code == 200
    for path in (f"/api/runs/{run.pk}/log", f"/api/runs/{run.pk}/log/download"):
        response = client_for(outsider).get(path)
        assert response.status_code == 404 and response.json() == {"errors": {"run": f"run {run.pk} not found"}}
        assert Client().get(path).status_code == 401
    page = client_for(outsider).get(f"/runs/{run.pk}/log/")
    assert page.status_code == 404 and b"secret line" not in page.content
    assert Client().get(f"/runs/{run.pk}/log/").status_code == 302  # to the login


def get_viewer(team):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("vera", password="pw-vera")
    Membership.objects.create(team=team, user=user, role=Membership.Role.VIEWER)
    return user


def test_the_run_page_links_the_log_page_which_shows_its_end(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.RUNNING)
    write_log(log_dir, run, LINES)
    client = client_for(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'id="driver-log" href="/runs/{run.pk}/log/"' in page
    log_page = client.get(f"/runs/{run.pk}/log/")
    assert log_page.status_code == 200
    html = log_page.content.decode()
    assert "line 19999" in html and "line 0\n" not in html
    assert f'href="/api/runs/{run.pk}/log/download"' in html
    # filesizeformat's figures, with a no-break space before each unit.
    assert re.search(r"The last 25\d\.\d\sKB of 1\.\d\sMB \(at most 256\.0\sKB are shown here", html), html[-600:]


def test_the_log_page_of_a_run_without_a_log_here_says_so(log_dir, make_run, client_for, owner):
    run = make_run(status=Run.Status.CANCELLED)
    page = client_for(owner).get(f"/runs/{run.pk}/log/")
    assert page.status_code == 404
    assert f"run {run.pk}&#x27;s driver log (run-{run.pk}.log) is not on this host" in page.content.decode()
    assert 'id="download-log"' not in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_rollway_logs_prints_the_end_and_all_of_it(live_server, log_dir, make_run, owner, team, capsys, monkeypatch):
    monkeypatch.setenv("ROLLWAY_CONFIG_DIR", str(log_dir / "config"))
    _, secret = tokens.do_create(owner, team, "viewer", "logs")
    site = ["--url", live_server.url, "--token", secret]
    run = make_run(status=Run.Status.RUNNING)
    write_log(log_dir, run, LINES)

    assert main(["logs", str(run.pk), *site]) == errors.OK
    out = capsys.readouterr()
    assert out.out.endswith("line 19999\n") and len(out.out.encode()) <= logs.TAIL_BYTES
    assert f"of {len(LINES.encode()):,} bytes; --all for the whole log" in out.err

    assert main(["logs", str(run.pk), "--all", *site]) == errors.OK
    assert capsys.readouterr().out == LINES

    queued = make_run()
    assert main(["logs", f"#{queued.pk}", *site]) == errors.NOT_FOUND
    assert "its driver has not started, so there is no log yet" in capsys.readouterr().err
    assert main(["logs", str(queued.pk), "--all", *site]) == errors.NOT_FOUND
