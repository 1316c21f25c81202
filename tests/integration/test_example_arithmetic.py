"""examples/arithmetic through the real stack: `rollway launch examples/arithmetic/run.yaml`
queues it (its dataset read beside the launch file, its reward functions imported and
checked by the site), a Celery worker runs it on Ray, it succeeds, and each reward
function left its rewards/<name>/mean and /std series."""

from __future__ import annotations

import re

import pytest

from tests.integration.helpers import TINY, rollway
from tests.integration.stack import REPO

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS = 3


def test_the_arithmetic_example_launches_from_its_file_and_reports_each_reward_function(
    stack, cli_env, show_logs_on_failure
):
    from runs.models import MetricPoint, Run

    env, team = cli_env
    stack.ensure_worker()
    sets = [
        f"stop.max_steps={STEPS}",
        f"warm_start.steps={TINY['warm_start']['steps']}",
        "warm_start.noisy_steps=0",
        f"trainer.batch_groups={TINY['trainer']['batch_groups']}",
        f"trainer.group_size={TINY['trainer']['group_size']}",
    ]
    launched = rollway(
        env, "launch", str(REPO / "examples" / "arithmetic" / "run.yaml"), "--team", team.slug,
        *[arg for s in sets for arg in ("--set", s)],
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_id = int(re.match(r"run (\d+) queued", launched.stdout).group(1))
    run = Run.objects.get(pk=run_id)
    assert run.config["task"]["dataset"]["path"] == str(REPO / "examples" / "arithmetic" / "arithmetic.jsonl")

    followed = rollway(env, "follow", str(run_id), "--interval", "1", timeout_s=300)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert Run.objects.get(pk=run_id).status == Run.Status.SUCCEEDED

    series = set(MetricPoint.objects.filter(run_id=run_id).values_list("series", flat=True))
    for name in ("correct_answer", "sign_first"):
        assert {f"rewards/{name}/mean", f"rewards/{name}/std"} <= series, sorted(series)
    steps = MetricPoint.objects.filter(run_id=run_id, series="rewards/correct_answer/mean").count()
    assert steps == STEPS
