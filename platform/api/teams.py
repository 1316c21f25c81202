"""The teams API: members and roles, and the audit log.

GET    /api/teams/<team>/members             the members and their roles (any member)
POST   /api/teams/<team>/members             {"username", "role"}: add, or change a role (admins)
DELETE /api/teams/<team>/members/<username>  remove a member (admins)
GET    /api/teams/<team>/audit               the audit log, newest first (admins); ?before=<id>

<team> is the team's id or slug. A team the caller is not in is a 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods
from pydantic import BaseModel, ConfigDict, ValidationError

from api.http import BadParam, api_login_required, int_param, json_object, refusal_response
from runs.actions import check_team_access
from runs.errors import ActionError, NotFound
from teams import actions
from teams.models import AuditEvent, Membership

AUDIT_PAGE = 100


class MemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: Any = None
    role: Any = Membership.Role.MEMBER


def _member(m: Membership) -> dict:
    return {"username": m.user.username, "role": m.role, "joined_at": m.joined_at.isoformat()}


def _team(user, team: str):
    try:
        return check_team_access(user, team)
    except ActionError as exc:
        raise NotFound(exc.errors) from None


@require_http_methods(["GET", "POST"])
@api_login_required
def members(request: HttpRequest, team: str) -> JsonResponse:
    try:
        if request.method == "GET":
            found = _team(request.user, team)
            listed = found.memberships.select_related("user").order_by("user__username")
            return JsonResponse({"team": found.slug, "members": [_member(m) for m in listed]})
        found = actions.check_manage(request.user, team)
        data = MemberIn.model_validate(json_object(request))
        member, new = actions.do_set_member(request.user, found, data.username, data.role)
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    return JsonResponse(_member(member), status=201 if new else 200)


@require_http_methods(["DELETE"])
@api_login_required
def member(request: HttpRequest, team: str, username: str) -> JsonResponse:
    try:
        found = actions.check_manage(request.user, team)
        actions.do_remove_member(request.user, found, username)
    except ActionError as exc:
        return refusal_response(exc)
    return JsonResponse({"removed": username})


@require_GET
@api_login_required
def audit(request: HttpRequest, team: str) -> JsonResponse:
    try:
        found = actions.check_manage(request.user, team)
        before = int_param(request, "before", None, lo=1)
    except (ActionError, BadParam) as exc:
        return refusal_response(exc)
    events = AuditEvent.objects.filter(team=found)
    if before is not None:
        events = events.filter(pk__lt=before)
    page = list(events.order_by("-pk")[:AUDIT_PAGE])
    return JsonResponse(
        {
            "events": [
                {
                    "id": e.pk,
                    "at": e.at.isoformat(),
                    "actor": e.actor_name,
                    "action": e.action,
                    "subject": e.subject,
                    "detail": e.detail,
                }
                for e in page
            ],
            "next": f"?before={page[-1].pk}" if len(page) == AUDIT_PAGE else None,
        }
    )
