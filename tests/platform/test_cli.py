"""The `rollway` command line against a real site in this process (pytest-django's live
server on the test database) with a real personal API token: what each command sends
lands in the database, what the site refuses comes back as a readable message and the
documented exit code, and an exported model is unpacked without escaping its directory.

No Celery worker runs here: a launched run stays queued (conftest's `enqueued`)."""

from __future__ import annotations

import http.server
import io
import json
import re
import stat
import threading
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollway_cli import credentials, errors
from rollway_cli.main import cli, main
from runs.models import Experiment, MetricPoint, Run
from teams import tokens
from teams.models import AuditEvent
from workers.config.presets import build

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    """Each test its own credentials file and no URL or token from the environment."""
    monkeypatch.setenv("ROLLWAY_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("ROLLWAY_URL", raising=False)
    monkeypatch.delenv("ROLLWAY_TOKEN", raising=False)
    return tmp_path / "config"


@pytest.fixture
def secret(owner, team):
    """A member token of the owner's team, made the way the site makes them."""
    _, secret = tokens.do_create(owner, team, "member", "cli tests")
    return secret


@pytest.fixture
def site(live_server, secret, monkeypatch):
    """The live site and token, given to the commands through the environment."""
    monkeypatch.setenv("ROLLWAY_URL", live_server.url)
    monkeypatch.setenv("ROLLWAY_TOKEN", secret)
    return live_server.url


def rollway(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def add_points(run: Run, series: str, values: list[float]) -> None:
    MetricPoint.objects.upsert(run.pk, [(series, step, v, 1000.0 + step) for step, v in enumerate(values, start=1)])


# --- login ----------------------------------------------------------------------------


def test_login_checks_the_token_and_stores_it_readable_by_the_owner_only(live_server, secret, team, capsys):
    code, out, err = rollway(capsys, "login", "--url", live_server.url + "/", "--token", secret)
    assert code == 0, err
    assert f"team {team.slug}" in out and "member" in out
    path = credentials.credentials_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": live_server.url, "token": secret}
    # The next command needs neither flag nor environment.
    assert rollway(capsys, "runs")[0] == 0
    code, out, _ = rollway(capsys, "logout")
    assert code == 0 and not path.exists()


def test_login_prompts_for_what_is_missing_and_hides_the_token(live_server, secret):
    result = CliRunner().invoke(cli, ["login"], input=f"{live_server.url}\n{secret}\n")
    assert result.exit_code == 0, result.output
    assert secret not in result.output  # typed, not echoed
    assert credentials.stored() == credentials.Credentials(live_server.url, secret)


def test_login_with_a_bad_token_stores_nothing(live_server, capsys):
    code, _, err = rollway(capsys, "login", "--url", live_server.url, "--token", "rwp_not-a-token")
    assert code == errors.NOT_ALLOWED
    assert "unknown or revoked" in err and "Traceback" not in err
    assert not credentials.credentials_path().exists()


def test_the_environment_overrides_the_saved_login(live_server, secret, monkeypatch, capsys):
    credentials.save("http://127.0.0.1:9", "rwp_stale")
    assert rollway(capsys, "runs")[0] == errors.UNREACHABLE
    monkeypatch.setenv("ROLLWAY_URL", live_server.url)
    monkeypatch.setenv("ROLLWAY_TOKEN", secret)
    assert rollway(capsys, "runs")[0] == 0


# --- runs -----------------------------------------------------------------------------


def test_runs_lists_the_teams_runs_with_filters(site, make_run, outsider, capsys):
    queued = make_run(name="tiny queued")
    running = make_run(status=Run.Status.RUNNING, name="big running")
    add_points(running, "reward/mean", [0.25, 0.5])
    code, out, err = rollway(capsys, "runs")
    assert code == 0, err
    assert "tiny queued" in out and "big running" in out and "0.500" in out and "2 runs" in out
    code, out, _ = rollway(capsys, "runs", "--status", "running", "--json")
    assert [r["id"] for r in json.loads(out)["runs"]] == [running.pk]
    code, out, _ = rollway(capsys, "runs", "--search", "tiny", "--json")
    assert [r["id"] for r in json.loads(out)["runs"]] == [queued.pk]
    code, _, err = rollway(capsys, "runs", "--status", "sleeping")
    assert code == errors.BAD_REQUEST and "status: unknown status sleeping" in err


# --- launch ---------------------------------------------------------------------------


def test_launch_from_a_yaml_file_with_set_creates_the_run_with_that_config(
    site, experiment, owner, tmp_path, capsys, enqueued
):
    spec = tmp_path / "run.yaml"
    spec.write_text(
        f"preset: async\n"
        f"name: from the cli\n"
        f"experiment: {experiment.pk}\n"
        f"priority: 3\n"
        f"buffer.capacity: 4\n"  # a dotted config override at the top level
        f"overrides:\n"
        f"  trainer: {{group_size: 4}}\n"
        f"  stop: {{max_minutes: 2}}\n"
    )
    code, out, err = rollway(
        capsys, "launch", str(spec), "--set", "buffer.capacity=8", "--set", "stop.max_steps=20",
        "--set", "lora.enabled=true",
    )  # fmt: skip
    assert code == 0, err
    run = Run.objects.get()
    assert out.splitlines() == [f"run {run.pk} queued: from the cli", f"{site}/runs/{run.pk}/"]
    assert (run.name, run.preset, run.priority, run.launched_by, run.experiment) == (
        "from the cli", "async", 3, owner, experiment,
    )  # fmt: skip
    assert run.overrides == {
        "buffer": {"capacity": 8},  # --set wins over the file
        "trainer": {"group_size": 4},
        "stop": {"max_minutes": 2, "max_steps": 20},
        "lora": {"enabled": True},  # a YAML boolean, not the string "true"
    }
    assert run.config["buffer"]["capacity"] == 8 and run.config["stop"]["max_steps"] == 20
    assert run.config["lora"]["enabled"] is True and run.config["trainer"]["group_size"] == 4


def test_launch_options_alone_with_a_team_slug_and_an_experiment_name(site, team, experiment, capsys):
    code, _, err = rollway(
        capsys, "launch", "--preset", "sync", "--team", team.slug, "--experiment", experiment.name, "--json"
    )
    assert code == 0, err
    run = Run.objects.get()
    assert (run.preset, run.experiment) == ("sync", experiment)


def test_launch_chooses_trackers_from_the_file_or_the_option(site, team, experiment, capsys, settings, tmp_path):
    settings.ROLLWAY_MLFLOW_TRACKING_URI, settings.ROLLWAY_WANDB_PROJECT = "", ""
    settings.ROLLWAY_TENSORBOARD_DIR = str(tmp_path / "tb")
    spec = tmp_path / "run.yaml"
    spec.write_text(f"preset: sync\nexperiment: {experiment.pk}\ntrackers: [tensorboard]\n")
    assert rollway(capsys, "launch", str(spec))[0] == 0
    assert rollway(capsys, "launch", str(spec), "--trackers", "")[0] == 0  # the option wins: none
    code, _, err = rollway(capsys, "launch", "--preset", "sync", "--team", team.slug, "--trackers", "wandb")
    assert code == errors.BAD_REQUEST and "this site does not export to W&B" in err
    assert [run.trackers for run in Run.objects.order_by("pk")] == [["tensorboard"], []]


def test_launch_prints_the_settings_the_checkpoint_would_want(site, team, experiment, capsys, monkeypatch):
    from configs import policy

    fit = {"field": "trainer.lr", "current": 0.001, "suggested": 1e-6, "why": "a 494M-parameter model"}
    monkeypatch.setattr(policy, "settings_that_fit", lambda config: [fit])
    code, out, err = rollway(capsys, "launch", "--preset", "sync", "--team", team.slug)
    assert code == 0, err
    assert "  trainer.lr 0.001 → 1e-06: a 494M-parameter model" in out


def test_launch_warns_of_a_setting_its_run_will_not_read(site, team, experiment, capsys):
    code, out, err = rollway(capsys, "launch", "--preset", "sync", "--team", team.slug, "--set", "sync.packed=false")
    assert code == 0, err
    assert "  warning: sync.packed is read only by a collective" in out
    assert Run.objects.get().config["sync"]["packed"] is False


def test_refused_launches_name_the_field_and_exit_2(site, experiment, tmp_path, capsys):
    code, _, err = rollway(
        capsys, "launch", "--preset", "async", "--experiment", str(experiment.pk), "--set", "buffer.capacity=0"
    )
    assert code == errors.BAD_REQUEST
    assert err.startswith("error: buffer.capacity: ") and "Traceback" not in err
    code, _, err = rollway(capsys, "launch", "--preset", "nope", "--set", "stop.max_step=3")
    assert code == errors.BAD_REQUEST
    assert "preset: unknown preset 'nope'" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    code, _, err = rollway(capsys, "launch", str(bad))
    assert code == errors.BAD_REQUEST and "top level must be a mapping" in err
    code, _, err = rollway(capsys, "launch", "--preset", "async", "--set", "buffer.capacity")
    assert code == errors.BAD_REQUEST and "field.path=value" in err
    assert not Run.objects.exists()


def test_a_viewer_token_is_refused_with_exit_4(live_server, owner, team, experiment, capsys):
    _, viewer = tokens.do_create(owner, team, "viewer", "read only")
    code, _, err = rollway(
        capsys, "launch", "--url", live_server.url, "--token", viewer, "--preset", "sync", "--experiment",
        str(experiment.pk),
    )  # fmt: skip
    assert code == errors.NOT_ALLOWED and "viewer" in err


# --- simulate -------------------------------------------------------------------------


def test_simulate_from_a_yaml_file_and_options_stores_a_simulated_run(site, experiment, owner, tmp_path, capsys):
    spec = tmp_path / "sim.yaml"
    spec.write_text(
        f"preset: async\n"
        f"name: async on 32\n"
        f"experiment: {experiment.pk}\n"
        f"cluster: {{gpus: 8, tp: 2}}\n"  # --gpus wins, tp stays
        f"workload: {{median_tokens: 1024}}\n"
        f"buffer.capacity: 64\n"
    )
    code, out, err = rollway(
        capsys, "simulate", str(spec), "--gpus", "32", "--p90-tokens", "4096", "--steps", "10",
        "--set", "trainer.batch_groups=16",
    )  # fmt: skip
    assert code == 0, err
    run = Run.objects.get()
    lines = out.splitlines()
    assert lines[0] == f"run {run.pk} simulated: async on 32"
    assert lines[1].startswith("10 steps in ") and " samples/s, trainer busy " in lines[1]
    assert lines[2] == f"{site}/runs/{run.pk}/"
    assert (run.simulated, run.status, run.launched_by) == (True, "succeeded", owner)
    assert (run.simulation["cluster"]["gpus"], run.simulation["cluster"]["tp"]) == (32, 2)
    assert run.simulation["workload"]["median_tokens"] == 1024 and run.simulation["workload"]["p90_tokens"] == 4096
    assert run.config["buffer"]["capacity"] == 64 and run.config["trainer"]["batch_groups"] == 16
    assert run.points.filter(series="policy/version").count() == 10
    code, out, _ = rollway(capsys, "runs")
    assert code == 0 and "async on 32 (simulated)" in out


def test_a_refused_simulation_names_the_field_and_exits_2(site, experiment, capsys):
    code, _, err = rollway(
        capsys, "simulate", "--preset", "async", "--experiment", str(experiment.pk), "--gpus", "0",
        "--median-tokens", "900", "--p90-tokens", "100",
    )  # fmt: skip
    assert code == errors.BAD_REQUEST and "Traceback" not in err
    assert "cluster.gpus: " in err and "workload: p90_tokens (100) must be ≥ median_tokens (900)" in err
    assert not Run.objects.exists()


# --- follow, cancel -------------------------------------------------------------------


def test_follow_a_finished_run_prints_its_last_progress_and_exits_with_its_status(site, make_run, capsys):
    config = build("async", {"stop": {"max_steps": 4}}).model_dump(mode="json")
    done = make_run(status=Run.Status.SUCCEEDED, config=config)
    add_points(done, "policy/version", [1, 2, 3, 4])
    add_points(done, "reward/mean", [0.1, 0.2, 0.3, 0.75])
    code, out, err = rollway(capsys, "follow", str(done.pk))
    assert code == 0, err
    assert "step 4/4 (100%)" in out and "reward/mean=0.750" in out
    assert out.splitlines()[-1].startswith(f"run {done.pk} succeeded after 4 steps")

    failed = make_run(status=Run.Status.FAILED, error="out of memory: lower trainer.batch_groups")
    code, out, _ = rollway(capsys, "follow", f"{site}/runs/{failed.pk}/")
    assert code == errors.RUN_FAILED and "error: out of memory: lower trainer.batch_groups" in out
    cancelled = make_run(status=Run.Status.CANCELLED)
    assert rollway(capsys, "follow", f"#{cancelled.pk}")[0] == errors.RUN_CANCELLED


def test_follow_json_gives_one_object_per_poll(site, make_run, capsys):
    done = make_run(status=Run.Status.SUCCEEDED)
    add_points(done, "loss", [0.5])
    code, out, _ = rollway(capsys, "follow", str(done.pk), "--json")
    snapshot = json.loads(out)
    assert code == 0 and snapshot["status"] == "succeeded" and snapshot["loss"] == 0.5


def test_cancel_cancels_what_it_may_and_says_why_for_the_rest(site, make_run, outsider, enqueued, capsys):
    mine = make_run(status=Run.Status.RUNNING)
    ended = make_run(status=Run.Status.SUCCEEDED)
    code, out, err = rollway(capsys, "cancel", str(mine.pk), str(ended.pk), "999999")
    assert code == errors.PARTLY_REFUSED
    assert f"run {mine.pk} cancelling" in out
    assert f"run {ended.pk} refused: run {ended.pk} is succeeded; nothing to cancel" in err
    assert "run 999999 refused: run 999999 not found" in err
    mine.refresh_from_db()
    assert mine.status == Run.Status.CANCELLING
    assert rollway(capsys, "cancel", str(mine.pk))[0] == errors.PARTLY_REFUSED  # already cancelling


def test_replay_queues_a_replay_of_a_run_with_its_schedule_and_says_why_not_otherwise(site, make_run, enqueued, capsys):
    from runs.models import RunSchedule

    done = make_run(status=Run.Status.SUCCEEDED)
    code, out, err = rollway(capsys, "replay", str(done.pk))
    assert code == errors.CONFLICT and f"run {done.pk} recorded no schedule" in err
    groups = done.run_config.trainer.batch_groups  # a batch as the run took them
    batch = [f"w0-{i}" for i in range(groups)]
    RunSchedule.objects.create(run=done, admissions=[[0, 0, groups]], batches=[[0, batch]], bytes=40, steps=1)
    code, out, err = rollway(capsys, "replay", str(done.pk))
    assert code == 0, err
    child = Run.objects.get(parent=done)
    assert child.origin == "replay" and out.startswith(f"run {child.pk} queued: ")
    assert f"/runs/{child.pk}/" in out


def test_a_run_of_another_team_is_not_found_with_exit_5(site, outsider, capsys):
    theirs = Run.objects.create(experiment=Experiment.objects.get(name="theirs"), name="x", preset="sync", config={})
    code, _, err = rollway(capsys, "follow", str(theirs.pk))
    assert code == errors.NOT_FOUND and f"run: run {theirs.pk} not found" in err


def test_an_unreachable_site_exits_7_without_a_traceback(secret, capsys):
    code, _, err = rollway(capsys, "runs", "--url", "http://127.0.0.1:9", "--token", secret)
    assert code == errors.UNREACHABLE and "cannot reach the site" in err and "Traceback" not in err
    code, _, err = rollway(capsys, "runs")
    assert code == errors.NOT_ALLOWED and "rollway login" in err


# --- compare --------------------------------------------------------------------------


def test_compare_shows_only_the_config_fields_that_differ_and_each_outcome(site, make_run, capsys):
    small = make_run(config=build("async", {"buffer": {"capacity": 4}}).model_dump(mode="json"), name="cap 4")
    large = make_run(config=build("async", {"buffer": {"capacity": 8}}).model_dump(mode="json"), name="cap 8")
    add_points(small, "reward/mean", [0.1, 0.9, 0.4])
    add_points(small, "policy/version", [1, 2, 3])
    code, out, err = rollway(capsys, "compare", str(small.pk), str(large.pk), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["differences"] == {"buffer.capacity": [4, 8]}
    assert result["runs"][0] | {"name": None} == {
        "id": small.pk, "name": None, "status": "queued", "steps": 3, "final_reward": 0.4, "best_reward": 0.9,
    }  # fmt: skip
    assert result["runs"][1]["steps"] is None and result["runs"][1]["best_reward"] is None
    code, out, _ = rollway(capsys, "compare", str(small.pk), str(large.pk))
    assert "buffer.capacity" in out and "stop.max_steps" not in out and "0.900" in out
    assert rollway(capsys, "compare", str(small.pk))[0] == 2  # click's usage error


# --- team -----------------------------------------------------------------------------


def test_team_add_role_members_and_remove_as_the_teams_admin(site, owner, team, capsys):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("nina", email="nina@example.org")
    _, admin = tokens.do_create(owner, team, "admin", "cli admin")
    code, out, err = rollway(capsys, "team", "add", team.slug, "nina@example.org", "--role", "viewer", "--token", admin)
    assert code == 0, err
    assert out == f"nina is viewer in team {team.slug}\n"
    assert rollway(capsys, "team", "role", team.slug, "nina", "member", "--token", admin)[0] == 0
    code, out, _ = rollway(capsys, "team", "members", team.slug)  # a member's token may read
    assert code == 0 and re.search(r"nina\s+member", out) and re.search(r"olga\s+admin", out)
    code, out, _ = rollway(capsys, "team", "remove", team.slug, "nina", "--token", admin)
    assert code == 0 and out == f"removed nina from team {team.slug}\n"
    assert list(team.memberships.values_list("user__username", flat=True)) == ["olga"]
    assert list(AuditEvent.objects.order_by("pk").values_list("action", flat=True)) == [
        "member_add",
        "member_role",
        "member_remove",
    ]


def test_team_refusals_name_the_field_with_their_exit_codes(site, owner, team, capsys):
    _, admin = tokens.do_create(owner, team, "admin", "cli admin")
    code, _, err = rollway(capsys, "team", "add", team.slug, "ghost", "--token", admin)
    assert code == errors.BAD_REQUEST and "username: no user 'ghost'" in err
    code, _, err = rollway(capsys, "team", "role", team.slug, "olga", "viewer", "--token", admin)
    assert code == errors.CONFLICT and "last admin" in err
    code, _, err = rollway(capsys, "team", "remove", team.slug, "olga", "--token", admin)
    assert code == errors.CONFLICT and "last admin" in err
    code, _, err = rollway(capsys, "team", "add", team.slug, "olga", "--role", "member")  # a member's token
    assert code == errors.NOT_ALLOWED and "admin role" in err
    code, _, err = rollway(capsys, "team", "members", "elsewhere", "--token", admin)
    assert code == errors.NOT_FOUND
    assert team.role_of(owner) == "admin" and not AuditEvent.objects.exists()


def test_team_create_needs_a_site_admins_token(site, owner, team, capsys):
    code, _, err = rollway(capsys, "team", "create", "Robotics")  # olga is no site admin
    assert code == errors.NOT_ALLOWED and "site admin" in err
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    _, admin = tokens.do_create(owner, team, "admin", "cli admin")
    code, out, err = rollway(capsys, "team", "create", "Robotics", "--slug", "robo", "--json", "--token", admin)
    assert code == 0, err
    assert json.loads(out) | {"id": 0} == {"id": 0, "slug": "robo", "name": "Robotics", "admin": "olga"}
    code, _, err = rollway(capsys, "team", "create", "Robotics", "--slug", "robo", "--token", admin)
    assert code == errors.CONFLICT and "slug: a team 'robo' exists already" in err


def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    code, out, _ = rollway(capsys, "--version")
    assert code == 0 and out == f"rollway, version {version('rollway')}\n"


# --- export ---------------------------------------------------------------------------


def test_export_unpacks_the_model_directory_and_lists_the_files(site, make_run, settings, tmp_path, capsys):
    settings.ROLLWAY_EXPORT_DIR = str(tmp_path / "exports")
    run = make_run(status=Run.Status.SUCCEEDED)
    model = tmp_path / "exports" / f"run-{run.pk}"
    (model / "nested").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "nested" / "weights.bin").write_bytes(bytes(range(256)) * 10)
    out_dir = tmp_path / "model"
    code, out, err = rollway(capsys, "export", str(run.pk), str(out_dir))
    assert code == 0, err
    assert (out_dir / "config.json").read_text() == '{"model_type": "llama"}'  # the wrapping folder is dropped
    assert (out_dir / "nested" / "weights.bin").read_bytes() == bytes(range(256)) * 10
    assert f"run {run.pk}: 2 files" in out and str(out_dir / "config.json") in out
    code, _, err = rollway(capsys, "export", str(run.pk), str(out_dir))
    assert code == errors.BAD_REQUEST and "exists already" in err


def test_export_of_an_unfinished_run_is_a_conflict(site, make_run, tmp_path, capsys):
    run = make_run(status=Run.Status.RUNNING)
    code, _, err = rollway(capsys, "export", str(run.pk), str(tmp_path / "model"))
    assert code == errors.CONFLICT and f"run {run.pk} is running" in err
    assert not (tmp_path / "model").exists()


def zip_of(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class _OneZip(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/zip")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile_site():
    """A site whose export answers whatever zip the test sets (`.body`)."""
    handler = type("Handler", (_OneZip,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "evil",
    ["run-1-model/../../escaped.txt", "../escaped.txt", "/tmp/rollway-escaped.txt", "run-1-model\\..\\escaped.txt"],
)
def test_export_refuses_a_zip_that_writes_outside_the_directory(hostile_site, evil, tmp_path, capsys):
    hostile_site.body = zip_of({"run-1-model/config.json": b"{}", evil: b"gotcha"})
    dest = tmp_path / "deep" / "model"
    code, _, err = rollway(capsys, "export", "1", str(dest), "--url", hostile_site.url, "--token", "rwp_x")
    assert code == errors.BAD_REQUEST and "nothing was written" in err
    assert not dest.exists()  # checked whole before the first file
    assert not list(tmp_path.rglob("escaped.txt")) and not Path("/tmp/rollway-escaped.txt").exists()


def test_export_refuses_a_symbolic_link_entry(hostile_site, tmp_path, capsys):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        link = zipfile.ZipInfo("run-1-model/tokenizer.json")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    hostile_site.body = buffer.getvalue()
    code, _, err = rollway(capsys, "export", "1", str(tmp_path / "m"), "--url", hostile_site.url, "--token", "rwp_x")
    assert code == errors.BAD_REQUEST and "symbolic link" in err


def test_simulate_with_plan_stores_the_best_setting_beside_the_config_as_given(site, experiment, capsys):
    code, out, err = rollway(
        capsys, "simulate", "--plan", "--preset", "async", "--experiment", str(experiment.pk), "--name", "7B",
        "--gpus", "64", "--median-tokens", "2048", "--p90-tokens", "8192", "--steps", "30",
    )  # fmt: skip
    assert code == 0, err
    best, baseline = Run.objects.get(name="7B (planned)"), Run.objects.get(name="7B")
    lines = out.splitlines()
    assert lines[0] == f"run {best.pk} planned: 7B (planned), the best of 60 settings"
    figures = (best.simulation["summary"]["samples_per_s"], baseline.simulation["summary"]["samples_per_s"])
    assert figures[0] > figures[1]
    assert lines[1].startswith(f"{figures[0]:.2f} samples/s against {figures[1]:.2f} as given (run {baseline.pk})")
    assert lines[2] == f"{site}/runs/{best.pk}/"
    assert "generating share" in lines[3] and "samples/s" in lines[3]
    top = best.simulation["plan"]["candidates"][0]
    assert top["protocol"] in out and f"{top['samples_per_s']:.2f}" in out
    assert lines[-1] == best.simulation["plan"]["staleness_caveat"]  # the search loosened the bound
    # --goal-samples without --plan is refused before anything is sent.
    code, _, err = rollway(
        capsys, "simulate", "--preset", "async", "--experiment", str(experiment.pk), "--goal-samples", "9"
    )
    assert code == errors.BAD_REQUEST and "--goal-samples: only with --plan" in err
    assert Run.objects.count() == 2
