"""Personal API tokens: made from the UI or the API by a signed-in person, shown once,
stored as a hash, scoped to one team and a role no higher than the maker's, revocable,
and stamped with when they were last used.

A request that carries `Authorization: Bearer rwp_…` on /api/ is that token's owner,
narrowed to the token's team and role (`scope`): `Team.objects.for_user` sees only that
team and `roles.role_of` gives at most the token's role (and never more than the owner's
role now: a demoted owner's tokens are demoted with them).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from foundation.errors import ActionError, Forbidden, NotFound, nul_errors
from foundation.fields import max_length
from teams import roles
from teams.models import ApiToken, Membership
from teams.roles import check_team_access

PREFIX = "rwp_"
NAME_MAX = max_length(ApiToken, "name")
# last_used_at is written at most this often per token: a busy script would otherwise
# write a row on every request.
TOUCH_EVERY = timedelta(seconds=60)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_new(user, *, team: Any, role: Any, name: Any) -> tuple:
    """(team, role, name) of a token the user may make; ActionError naming the field."""
    if getattr(user, "token_scope", None) is not None:
        raise Forbidden({"auth": "a token cannot make tokens: sign in to the site to make one"})
    errors = nul_errors({"name": name}) if isinstance(name, str) else {}
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > NAME_MAX:
        errors["name"] = f"must be 1 to {NAME_MAX} characters (what the token is for)"
    team_obj = None
    try:
        team_obj = check_team_access(user, team)
    except ActionError as exc:
        errors.update(exc.errors)
    if role not in Membership.Role.values:
        errors["role"] = f"choose one of {', '.join(Membership.Role.values)}"
    elif team_obj is not None:
        mine = roles.role_of(user, team_obj)  # a team of the user's: never None
        if mine is None or roles.RANK[Membership.Role(role)] > roles.RANK[Membership.Role(mine)]:
            errors["role"] = f"at most your own role in team {team_obj.slug} ({mine})"
    if errors:
        raise ActionError(errors)
    return team_obj, role, name.strip()


def do_create(user, team, role: str, name: str) -> tuple[ApiToken, str]:
    """The new token and its secret (shown once: only its hash is kept)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, team=team, role=role, name=name, prefix=secret[: len(PREFIX) + 4], digest=digest(secret)
    )
    return token, secret


def check_own(user, token_id: Any) -> ApiToken:
    try:
        token_id = int(token_id)
    except (TypeError, ValueError):
        raise NotFound({"token": f"no token {token_id!r}"}) from None
    found = ApiToken.objects.select_related("team").filter(user=user, pk=token_id).first()
    if found is None:
        raise NotFound({"token": f"you have no token {token_id}"})
    return found


def do_revoke(token: ApiToken) -> bool:
    """Revoke it now; False if it already was."""
    with transaction.atomic():
        return bool(ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now()))


def authenticate(secret: str):
    """The token's owner, scoped (`token_scope`: (team id, role)), or None for a token
    that is unknown, revoked, or whose owner is inactive or left the team."""
    token = ApiToken.objects.select_related("user", "team").filter(digest=digest(secret), revoked_at=None).first()
    if token is None or not token.user.is_active or token.team.role_of(token.user) is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    user = token.user  # this request's own instance: the scope lives on it alone
    user.token_scope = (token.team_id, token.role)  # type: ignore[attr-defined]  # on this instance only
    return user
