"""Fan-out of run events through the channel layer to WebSocket consumers.

Groups: "run-<id>" gets a run's metric points and status changes (the run page);
"runs" gets every status change (the runs list; consumers filter by team); "user-<id>"
gets word that the user lost access to a team (runs/signals.py), so a socket opened while
they were a member stops there.
A failed send is logged, never raised: the data is already stored, and a browser that
missed an event catches up from the API on its next load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

RUNS_GROUP = "runs"
POINTS_EVENT = "metrics.points"  # handled by RunConsumer.metrics_points
STATUS_EVENT = "run.status"  # handled by RunConsumer.run_status / RunsConsumer.run_status
REVOKED_EVENT = "access.revoked"  # handled by RunConsumer.access_revoked / RunsConsumer.access_revoked


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def _send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        # Whatever the channel layer raises (Redis down, a full channel): the data is
        # stored already, so a failed broadcast must not fail the ingest or the action.
        logger.exception("channel layer send to %s failed", group)


def points_frame(points: Sequence[Mapping[str, Any]]) -> str:
    """The WebSocket frame a run page gets for `points`: {"type": "points", "points": [...]}."""
    return json.dumps({"type": "points", "points": points}, separators=(",", ":"))


def send_points(run_id: int, points: Sequence[Mapping[str, Any]]) -> None:
    """Points as {"series", "step", "value", "time"} dicts, to the run's page.

    The frame is encoded here, once, rather than by each of the run's consumers: with
    many viewers on a run, encoding the same points for each of them costs the web
    process dearly (docs/performance.md), and a string crosses the channel layer cheaper
    than the points as objects."""
    _send(run_group(run_id), {"type": POINTS_EVENT, "run_id": run_id, "frame": points_frame(points)})


def send_status(run) -> None:
    """The run's summary, to its page and to the runs list of its team's members."""
    message = {"type": STATUS_EVENT, "team_id": run.experiment.team_id, "run": run.summary()}
    _send(run_group(run.pk), message)
    _send(RUNS_GROUP, message)


def send_access_revoked(user_id: int, team_id: int | None) -> None:
    """Tell the user's open sockets that they no longer see team `team_id`'s runs (None:
    any team's, e.g. a deactivated account)."""
    _send(user_group(user_id), {"type": REVOKED_EVENT, "team_id": team_id})
