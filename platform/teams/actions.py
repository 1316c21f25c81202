"""Making teams and managing their members: a site admin creates a team with its first
admin; the team's admins add a member, change a role, remove one (teams/roles.py). A
team never loses its last admin, so someone can always manage it. Each change is written
to the audit log in its own transaction."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from foundation.errors import ActionError, Conflict, Forbidden, NotFound, nul_errors
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


def _user(username: Any, *, field: str = "username"):
    """The account named by `username`, or by its email address when it holds an "@" and
    no username is that text (people know a colleague's address better than a login)."""
    if not isinstance(username, str) or not username.strip():
        raise ActionError({field: "give the username or email address of the person"})
    if bad := nul_errors({field: username}):
        raise ActionError(bad)
    name = username.strip()
    users = get_user_model().objects
    found = users.filter(username=name).first()
    if found is None and "@" in name:
        by_email = list(users.filter(email__iexact=name)[:2])
        if len(by_email) > 1:
            raise ActionError({field: f"several accounts have the email {name!r}: give the username"})
        found = by_email[0] if by_email else None
    if found is None:
        raise ActionError({field: f"no user {name!r}: they need an account on this site first (a site admin makes it)"})
    return found


def is_site_admin(user) -> bool:
    """Django staff or a superuser, signed in and active; through a personal API token,
    only a token with the admin role (a viewer's token stays read-only)."""
    if not user.is_authenticated or not user.is_active or not (user.is_staff or user.is_superuser):
        return False
    scope = getattr(user, "token_scope", None)
    return scope is None or scope[1] == Role.ADMIN


def check_new_team(user, name: Any, slug: Any = None, admin: Any = None) -> tuple[str, str, Any]:
    """(name, slug, first admin) of a team `user` may create: Forbidden unless a site
    admin; ActionError naming the field otherwise. The slug defaults to the name's."""
    if not is_site_admin(user):
        raise Forbidden({"team": "creating a team needs a site admin (Django staff or superuser)"})
    if bad := nul_errors({"name": name, "slug": slug, "admin": admin}):
        raise ActionError(bad)
    if not isinstance(name, str) or not name.strip():
        raise ActionError({"name": 'give the team\'s name, e.g. "Lab"'})
    name = name.strip()
    max_name = Team._meta.get_field("name").max_length
    if max_name is not None and len(name) > max_name:
        raise ActionError({"name": f"at most {max_name} characters (got {len(name)})"})
    if slug in (None, ""):
        slug = slugify(name)
        if not slug:
            raise ActionError({"name": f"{name!r} gives no slug (letters, digits, - or _): give a slug"})
    elif not isinstance(slug, str) or slugify(slug) != slug:
        raise ActionError({"slug": f"use lowercase letters, digits, - and _ only (got {slug!r})"})
    max_slug = Team._meta.get_field("slug").max_length
    if max_slug is not None and len(slug) > max_slug:
        raise ActionError({"slug": f"at most {max_slug} characters (got {len(slug)})"})
    if Team.objects.filter(slug=slug).exists():
        raise Conflict({"slug": f"a team {slug!r} exists already: choose another slug or name"})
    first_admin = user if admin in (None, "") else _user(admin, field="admin")
    return name, slug, first_admin


def do_create_team(actor, name: str, slug: str, first_admin) -> Team:
    """A team with `first_admin` as its admin (a team always has one). The creator joins
    only as that admin: staff get no rights in a team from being staff."""
    try:
        with transaction.atomic():
            team = Team.objects.create(name=name, slug=slug)
            Membership.objects.create(team=team, user=first_admin, role=Role.ADMIN)
            audit.record(actor, team, audit.Action.TEAM_CREATE, f"team {slug}", name=name, admin=first_admin.username)
    except IntegrityError:  # the same slug, created between the check and here
        raise Conflict({"slug": f"a team {slug!r} exists already: choose another slug or name"}) from None
    return team


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


def do_remove_member(actor, team: Team, username: Any):
    """Remove `username` (or the account with that email) from `team`; returns the user."""
    user = _user(username)
    with transaction.atomic():
        member = team.memberships.select_for_update().select_related("user").filter(user=user).first()
        if member is None:
            raise NotFound({"username": f"{user.username} is not in team {team.slug}"})
        _keeps_an_admin(team, member, None)
        member.delete()
        audit.record(actor, team, audit.Action.MEMBER_REMOVE, f"user {user.username}", was=member.role)
    return user
