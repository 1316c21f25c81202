"""Celery tasks: schedule the run queue, launch, cancel and reconcile runs, each a thin
wrapper over its action.

Each task is registered under the name runs/dispatch.py sends it by (the beat schedule
and messages already queued name them too, so they never change); the work itself is
in runs/in_ray.py and runs/reconcile.py.
"""

from __future__ import annotations

from celery import shared_task

from runs import dispatch
from runs.in_ray import do_start_in_ray, do_stop_in_ray
from runs.queue import do_schedule_queue
from runs.reconcile import do_reconcile_runs
from runs.tracking import do_export_run


@shared_task(name=dispatch.LAUNCH_RUN, ignore_result=True)
def launch_run(run_id: int) -> None:
    """Claim a queued run (queued → starting) and start its driver actor in Ray."""
    do_start_in_ray(run_id)


@shared_task(name=dispatch.CANCEL_RUN, ignore_result=True)
def cancel_run(run_id: int) -> None:
    """Stop a cancelling run's actors, then mark it cancelled."""
    do_stop_in_ray(run_id)


@shared_task(name=dispatch.RECONCILE_RUNS, ignore_result=True)
def reconcile_runs() -> dict[str, int]:
    """Bring the Run rows in line with Ray (beat runs it every 15 s)."""
    return do_reconcile_runs()


@shared_task(name=dispatch.SCHEDULE_QUEUE, ignore_result=True)
def schedule_queue() -> list[int]:
    """Schedule the queued runs that may start now and send `launch_run` for each."""
    return do_schedule_queue()


@shared_task(name=dispatch.EXPORT_RUN_METRICS, ignore_result=True)
def export_run_metrics(run_id: int) -> int:
    """Send a run's points stored since the last export to its MLflow run."""
    return do_export_run(run_id)


@shared_task(name=dispatch.FINISH_RUN_METRICS, ignore_result=True)
def finish_run_metrics(run_id: int) -> int:
    """Send an ended run's last points to its MLflow run and close it with its outcome."""
    return do_export_run(run_id, final=True)
