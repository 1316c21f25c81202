"""Who may see a team, and what each role in it may do, in one place.

- viewer: reads everything of the team (runs, metrics, comparisons, configurations).
- member: also launches runs and comparisons (and retries, resumes and clones runs),
  saves configurations, exports models, and cancels and annotates (notes, tags) the runs
  they launched.
- admin: also cancels and annotates anyone's run and manages the team's members and
  their roles.

Site staff get no rights in a team from being staff: a superuser has every right (the
Django admin is theirs), anyone else only what their membership gives. The actions
layer asks here before it changes anything; a refusal is `Forbidden` (HTTP 403) naming
the role the action needs, while a team the user is not in stays invisible (404).
A team's runs, experiments and configurations are visible exactly to its members
(`visible_to` on their models builds on `Team.objects.for_user`).
"""

from __future__ import annotations

from typing import Any

from foundation.errors import ActionError, Forbidden, nul_errors
from foundation.ids import ID_TEXT
from teams.models import Membership, Team

Role = Membership.Role
RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}

# action → the least role it needs; the words are what a refusal says.
NEEDS = {
    "launch runs": Role.MEMBER,
    "create experiments": Role.MEMBER,
    "launch comparisons": Role.MEMBER,
    "save configurations": Role.MEMBER,
    "export models": Role.MEMBER,
    "cancel runs": Role.MEMBER,  # their own; anyone's needs "cancel others' runs"
    "cancel others' runs": Role.ADMIN,
    "edit notes": Role.MEMBER,  # of their own runs; anyone's needs "edit others' notes"
    "edit others' notes": Role.ADMIN,
    "manage members": Role.ADMIN,
}


def role_of(user, team: Team) -> str | None:
    """The user's role in `team`; a superuser counts as its admin; None for an outsider.
    Through a personal API token: at most the token's role, in the token's team only."""
    scope = getattr(user, "token_scope", None)
    if scope is not None and scope[0] != team.pk:
        return None
    role = Role.ADMIN if getattr(user, "is_superuser", False) and user.is_active else team.role_of(user)
    if scope is not None and role is not None and RANK[Role(scope[1])] < RANK[Role(role)]:
        role = scope[1]
    return role


def allows(role: str | None, action: str) -> bool:
    return role is not None and RANK[Role(role)] >= RANK[NEEDS[action]]


def cancel_action(user, run) -> str:
    """What cancelling `run` is for `user`: their own run, or someone else's."""
    own = run.launched_by_id is not None and run.launched_by_id == user.pk
    return "cancel runs" if own else "cancel others' runs"


def annotate_action(user, run) -> str:
    """What editing the notes and tags of `run` is for `user`: their own run or not."""
    own = run.launched_by_id is not None and run.launched_by_id == user.pk
    return "edit notes" if own else "edit others' notes"


def may_cancel(user, run) -> bool:
    return allows(role_of(user, run.experiment.team), cancel_action(user, run))


def require(user, team: Team, action: str, *, field: str = "team") -> str:
    """The user's role in `team` if it allows `action`; Forbidden on `field` otherwise."""
    role = role_of(user, team)
    if role is None or not allows(role, action):
        need = NEEDS[action]
        raise Forbidden(
            {field: f"to {action} in team {team.slug} you need the {need} role or higher (yours: {role or 'none'})"}
        )
    return role


def check_team_access(user, team: Any) -> Team:
    """A team of the user's, by id or slug; ActionError on "team" for any other (an
    outsider learns nothing of other teams)."""
    if bad := nul_errors({"team": team}):
        raise ActionError(bad)
    teams = Team.objects.for_user(user)
    found = teams.filter(pk=team).first() if ID_TEXT.fullmatch(str(team)) else teams.filter(slug=team).first()
    if found is None:
        raise ActionError({"team": f"you are not a member of team {team!r}"})
    return found
