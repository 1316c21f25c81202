"""Managing a team's members: add one, change a role, remove one. Only the team's admins
may (teams/roles.py); a team never loses its last admin, so someone can always manage
it. Each change is written to the audit log in its own transaction."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from foundation.errors import ActionError, Conflict, NotFound, nul_errors
from teams import audit, roles
from teams.models import Membership, Team
from teams.roles import check_team_access

Role = Membership.Role


def check_role(value: Any, *, field: str = "role") -> str:
    if value not in Role.values:
        raise ActionError({field: f"choose one of {', '.join(Role.values)} (got {value!r})"})
    return value


def check_manage(user, team: Any) -> Team:
    """A team of the user's (NotFound otherwise: outsiders learn nothing) whose members
    they may manage (Forbidden otherwise)."""
    try:
        found = check_team_access(user, team)
    except ActionError as exc:
        raise NotFound(exc.errors) from None
    roles.require(user, found, "manage members")
    return found


def _user(username: Any):
    if not isinstance(username, str) or not username.strip():
        raise ActionError({"username": "give the username of the person to add"})
    if bad := nul_errors({"username": username}):
        raise ActionError(bad)
    found = get_user_model().objects.filter(username=username.strip()).first()
    if found is None:
        raise ActionError({"username": f"no user {username.strip()!r}: they need an account on this site first"})
    return found


def _keeps_an_admin(team: Team, member: Membership, new_role: str | None) -> None:
    if member.role == Role.ADMIN and new_role != Role.ADMIN:
        admins = team.memberships.select_for_update().filter(role=Role.ADMIN).count()
        if admins <= 1:
            what = "removed" if new_role is None else f"made {new_role}"
            raise Conflict(
                {"username": f"{member.user.username} is team {team.slug}'s last admin and cannot be {what}; "
                 "make someone else admin first"}
            )  # fmt: skip


def do_set_member(actor, team: Team, username: Any, role: Any) -> tuple[Membership, bool]:
    """Add `username` to `team` with `role`, or change their role. Returns (the
    membership, whether it is new)."""
    role = check_role(role)
    user = _user(username)
    with transaction.atomic():
        member = team.memberships.select_for_update().select_related("user").filter(user=user).first()
        if member is None:
            member = Membership.objects.create(team=team, user=user, role=role)
            audit.record(actor, team, audit.Action.MEMBER_ADD, f"user {user.username}", role=role)
            return member, True
        if member.role != role:
            _keeps_an_admin(team, member, role)
            before, member.role = member.role, role
            member.save(update_fields=["role"])
            audit.record(actor, team, audit.Action.MEMBER_ROLE, f"user {user.username}", role=role, was=before)
    return member, False


def do_remove_member(actor, team: Team, username: Any) -> None:
    user = _user(username)
    with transaction.atomic():
        member = team.memberships.select_for_update().select_related("user").filter(user=user).first()
        if member is None:
            raise NotFound({"username": f"{user.username} is not in team {team.slug}"})
        _keeps_an_admin(team, member, None)
        member.delete()
        audit.record(actor, team, audit.Action.MEMBER_REMOVE, f"user {user.username}", was=member.role)
