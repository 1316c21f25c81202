"""The run queue at scale: seeds a throwaway SQLite database with N queued runs of five
teams (the site's limits full after two), then prints for each N

- the scheduler's first pass (it records every waiting run's reason and tells its
  watchers) and a second pass (nothing changed),
- the summaries of 50 queued runs, as a list page or the API shows them (each with its
  place in the queue and what it waits for).

Ray is replaced by a cluster with room for every run and Celery by a stub, so this
times the queue's own database work.

    .venv/bin/python bench/queue_scale.py                 # 50, 200 and 1000 queued runs
    .venv/bin/python bench/queue_scale.py --queued 5000
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import workers

REPO = Path(workers.__file__).resolve().parents[1]


def setup_django(home: str) -> None:
    os.environ["ROLLWAY_HOME"] = home
    os.environ["DATABASE_URL"] = f"sqlite:///{home}/queue.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class RoomyCluster:
    def __init__(self):
        from workers.run.admission import Capacity

        self.capacity = Capacity(cpus=64.0, memory_bytes=512 * 2**30)

    def cluster_capacity(self, *, ray_address):
        return self.capacity

    def available_capacity(self, *, ray_address):
        return self.capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, nargs="+", default=[50, 200, 1000])
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="rw-queue-")
    try:
        setup_django(home)
        run_bench(args.queued)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_bench(sizes: list[int]) -> None:

    from django.contrib.auth import get_user_model

    from rollway.celery import app
    from runs import in_ray, queue
    from runs.models import Experiment, Run
    from teams.models import Team
    from workers.config.presets import build

    class Sent:
        id = "bench"

    in_ray.ray_lifecycle = RoomyCluster
    app.send_task = lambda *a, **k: Sent()
    user = get_user_model().objects.create_user("bench")
    config = build("async").model_dump(mode="json")
    experiments = [Experiment.objects.create(team=Team.objects.create(name=f"T{k}"), name="e") for k in range(5)]
    for n in sizes:
        Run.objects.all().delete()
        Run.objects.bulk_create(
            Run(experiment=experiments[i % 5], name=f"r{i}", preset="async", config=config, launched_by=user)
            for i in range(n)
        )
        t = time.perf_counter()
        scheduled = queue.do_schedule_queue()
        first = time.perf_counter() - t
        t = time.perf_counter()
        queue.do_schedule_queue()
        again = time.perf_counter() - t
        page = list(Run.objects.filter(status="queued").select_related("experiment__team")[:50])
        t = time.perf_counter()
        for run in page:
            run.summary()
        summaries = time.perf_counter() - t
        print(
            f"{n:>6} queued: first pass {first * 1000:.0f} ms (scheduled {len(scheduled)}), "
            f"second pass {again * 1000:.0f} ms, summary() of 50 queued runs {summaries * 1000:.0f} ms"
        )


if __name__ == "__main__":
    if importlib.util.find_spec("rollway") is None:
        # The Django side is a source root (platform/), not an installed package: run
        # again with it on PYTHONPATH, as `manage.py` and `up` do for their children.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    main()
