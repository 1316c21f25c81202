"""Each team's share of the site, so that no team can starve the others:

- **queued**: runs waiting in the queue; a launch (or clone, retry, resume, comparison)
  past it is refused (runs/actions.py `check_team_queue`);
- **running**: runs active at once (starting, running, cancelling, or scheduled);
- **gpus**: GPUs the team's active runs hold together (each run's GPUs are what its
  placement asks Ray for, `workers.run.placement.totals`).

A run past the running or GPU quota is not refused: it waits in the queue until the
team's own runs end (runs/queue.py). Each quota is the site's default from settings
unless a site admin set the team's own (the Django admin's team page); None is no cap.

A run's priority orders it among its own team's queued runs (the teams take turns
whatever the priorities); how high a user may set it depends on their role
(`priority_range`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from teams.models import Membership, Team

# A run's queue priority: higher starts first among its team's runs. A small range keeps
# the levels meaningful to people; the column itself could hold far more.
PRIORITY_MIN, PRIORITY_MAX = -10, 10


@dataclass(frozen=True)
class Quota:
    """One of a team's quotas: its `limit` (None: no cap) and where it comes from, as
    a refusal names it ("ROLLWAY_TEAM_MAX_QUEUED=20", or the team's own setting)."""

    limit: int | None
    source: str

    def allows(self, total: float) -> bool:
        """Whether `total` stays within the quota."""
        return self.limit is None or total <= self.limit + 1e-9


# quota → (the Team field a site admin sets, the setting that is the default)
FIELDS = {
    "queued": ("max_queued_runs", "ROLLWAY_TEAM_MAX_QUEUED"),
    "running": ("max_running_runs", "ROLLWAY_MAX_RUNNING_PER_TEAM"),
    "gpus": ("max_gpus", "ROLLWAY_TEAM_MAX_GPUS"),
}


def quota(team: Team, name: str) -> Quota:
    """The team's quota `name` (a key of FIELDS)."""
    field, setting = FIELDS[name]
    own = getattr(team, field)
    if own is not None:
        return Quota(own, f"team {team.name}'s own {field}={own}, set by a site admin")
    default = getattr(settings, setting)
    return Quota(default, f"{setting}={'unset' if default is None else default}")


def quotas(team: Team) -> dict[str, int | None]:
    """{quota: limit} of the team (None: no cap), as the API and the teams page show."""
    return {name: quota(team, name).limit for name in FIELDS}


def priority_setting(role: str | None) -> str:
    """The setting that caps the priority `role` may give."""
    return "ROLLWAY_ADMIN_MAX_PRIORITY" if role == Membership.Role.ADMIN else "ROLLWAY_MEMBER_MAX_PRIORITY"


def priority_range(role: str | None) -> tuple[int, int]:
    """The priorities `role` may give a run: from PRIORITY_MIN (lowering a run of one's
    own team takes nothing from anyone) up to the role's setting (`priority_setting`)."""
    return PRIORITY_MIN, getattr(settings, priority_setting(role))
