"""Sending a run's Celery tasks, by name.

The actions layer enqueues tasks by their registered name and never imports the task
module: the tasks are thin wrappers around the actions, so importing them here would tie
the two into one loop. The names are part of the deployment (the beat schedule in
rollway/settings.py names `reconcile_runs`, and a message already queued names its
task), so runs/tasks.py registers each task under the constant defined here. They go through
Celery's current app, which the Django project (`rollway`) makes when it loads: the
apps never import the project package.
"""

from __future__ import annotations

import logging

from celery import current_app

logger = logging.getLogger(__name__)

LAUNCH_RUN = "runs.tasks.launch_run"
CANCEL_RUN = "runs.tasks.cancel_run"
RECONCILE_RUNS = "runs.tasks.reconcile_runs"
# The run queue's scheduler (runs/queue.py); takes no run id: it looks at every queued run.
SCHEDULE_QUEUE = "runs.tasks.schedule_queue"
# A run's new points to its MLflow run; the finishing one also closes it (runs/tracking.py).
EXPORT_RUN_METRICS = "runs.tasks.export_run_metrics"
FINISH_RUN_METRICS = "runs.tasks.finish_run_metrics"


def send(task: str, run_id: int | None = None) -> str:
    """Enqueue `task` for run `run_id` (None: a task that takes no run); returns the
    Celery task id. Raises whatever the broker raises."""
    return current_app.send_task(task, args=[] if run_id is None else [run_id]).id or ""


def send_or_log(task: str, run_id: int | None = None) -> str | None:
    """`send`, for a caller whose change is already committed: a broker that is down is
    logged, not raised, and the run is left for reconcile to send again. Returns the
    task id, None if nothing was sent."""
    try:
        return send(task, run_id)
    except Exception:
        # Any broker or transport error: the row already says what should happen, and
        # reconcile_runs resends from the row, so the user's request still succeeds.
        logger.exception("run %s: could not enqueue %s; reconcile will", run_id or "-", task.rsplit(".", 1)[-1])
        return None
