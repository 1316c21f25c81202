"""The `rollway` command line on the real stack: `rollway launch` queues a tiny run from a
YAML file through the site's API with a personal token, a separate Celery worker starts
it on a real Ray cluster, its driver posts metrics through the real web server into
PostgreSQL, and `rollway follow` (a separate process, as a person runs it) shows its progress until
it succeeds, then exits 0. Followed twice at once: piped (plain lines, what a log or CI
gets) and on a pseudo-terminal (the live bar)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.helpers import TINY, rollway
from tests.integration.stack import REPO

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS = 4
RUN_YAML = f"""\
preset: async
name: cli live
inference: {{backend: {TINY["inference"]["backend"]}}}
warm_start.steps: {TINY["warm_start"]["steps"]}
warm_start.noisy_steps: {TINY["warm_start"]["noisy_steps"]}
trainer:
  batch_groups: {TINY["trainer"]["batch_groups"]}
  group_size: {TINY["trainer"]["group_size"]}
stop: {{max_minutes: 4}}
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def follow_on_a_terminal(env, run_id: int) -> tuple[subprocess.Popen, list[bytes]]:
    """`rollway follow` with a pseudo-terminal for its stdout; what it drew is collected."""
    parent, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollway_cli", "follow", str(run_id), "--interval", "1"],
        cwd=REPO,
        env=env,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    drawn: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(parent, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            drawn.append(data)
        os.close(parent)

    threading.Thread(target=read, daemon=True).start()
    return proc, drawn


def test_rollway_launch_then_follow_to_the_end(stack, cli_env, tmp_path, show_logs_on_failure):
    from runs.models import MetricPoint, Run

    env, team = cli_env
    stack.ensure_worker()
    spec = tmp_path / "run.yaml"
    spec.write_text(RUN_YAML)

    launched = rollway(env, "launch", str(spec), "--team", team.slug, "--set", f"stop.max_steps={STEPS}")
    assert launched.returncode == 0, launched.stderr
    run_id = int(re.match(r"run (\d+) queued", launched.stdout).group(1))
    run = Run.objects.get(pk=run_id)
    assert run.config["stop"]["max_steps"] == STEPS and run.config["inference"]["backend"] == "torch"
    assert run.experiment.team == team

    terminal, drawn = follow_on_a_terminal(env, run_id)
    started = time.monotonic()
    piped = rollway(env, "follow", str(run_id), "--interval", "1", timeout_s=300)
    took = time.monotonic() - started
    assert terminal.wait(timeout=30) == 0
    screen = ANSI.sub("", b"".join(drawn).decode(errors="replace"))
    print(f"--- rollway follow {run_id} | cat ({took:.0f} s) ---\n{piped.stdout}{piped.stderr}")
    print(f"--- rollway follow {run_id} on a terminal, escape codes removed ---\n{screen}")

    assert piped.returncode == 0, piped.stdout + piped.stderr
    lines = piped.stdout.splitlines()
    assert any(f"step {STEPS}/{STEPS} (100%)" in line for line in lines), lines
    assert any(f"run {run_id} running" in line for line in lines[:-2]), "nothing shown while it ran"
    assert lines[-1].startswith(f"run {run_id} succeeded after {STEPS} steps")
    assert "\x1b[" not in piped.stdout  # piped: plain lines, no cursor moves
    assert "━" in screen and f"run {run_id} succeeded after {STEPS} steps" in screen
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    # The Celery worker launched it on Ray (it recorded the detached driver), and the
    # driver's points reached PostgreSQL through the web server, a loss at every step.
    assert run.ray_actor == f"run-{run_id}"
    points = MetricPoint.objects.filter(run_id=run_id)
    series = set(points.values_list("series", flat=True))
    assert {"reward/mean", "loss", "buffer/depth", "staleness/mean"} <= series, series
    assert sorted(points.filter(series="loss").values_list("step", flat=True)) == list(range(1, STEPS + 1))

    # The driver's own log, as the site serves it: its start, its phases and its end.
    logged = rollway(env, "logs", str(run_id))
    assert logged.returncode == 0, logged.stderr
    assert f"run {run_id}: driver started" in logged.stdout
    for line in (
        f"run {run_id}: phase warm_start",
        f"run {run_id}: phase stepping",
        f"run {run_id}: step {STEPS}: reward/mean",
    ):
        assert line in logged.stdout, logged.stdout
    assert f"run {run_id}: driver done: succeeded" in logged.stdout.splitlines()[-1]
