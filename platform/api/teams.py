"""The teams API: members and roles, and the audit log.

GET    /api/teams/<team>/members             the members and their roles (any member)
POST   /api/teams/<team>/members             {"username", "role"}: add, or change a role (admins)
DELETE /api/teams/<team>/members/<username>  remove a member (admins)
GET    /api/teams/<team>/audit               the audit log, newest first (admins); ?before=<id>

<team> is the team's id or slug. A team the caller is not in is a 404. `username` may be
the account's email address. Listing teams and creating one (`GET`/`POST /api/teams`)
are in api/views.py, whose router holds that path (ninja routes one path per router).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict

from api.openapi import query_doc, responses
from foundation.errors import ActionError, NotFound
from foundation.http import int_param
from teams import actions
from teams.models import AuditEvent, Membership
from teams.roles import check_team_access

router = Router(tags=["teams"])

AUDIT_PAGE = 100


class MemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: Any = None
    role: Any = Membership.Role.MEMBER


class MemberOut(Schema):
    username: str
    role: str
    joined_at: str


class Members(Schema):
    team: str
    members: list[MemberOut]


def _member(m: Membership) -> dict:
    return {"username": m.user.username, "role": m.role, "joined_at": m.joined_at.isoformat()}


def _team(user, team: str):
    try:
        return check_team_access(user, team)
    except ActionError as exc:
        raise NotFound(exc.errors) from None


@router.get("/teams/{str:team}/members", url_name="team-members", response=responses(Members, 200, 404))
def list_members(request: HttpRequest, team: str) -> JsonResponse:
    """A team's members and their roles (any member may look)."""
    found = _team(request.user, team)
    listed = found.memberships.select_related("user").order_by("user__username")
    return JsonResponse({"team": found.slug, "members": [_member(m) for m in listed]})


@router.post(
    "/teams/{str:team}/members",
    url_name="team-members",
    response={**responses(MemberOut, 200, 400, 403, 404, 409), 201: MemberOut},
)
def set_member(request: HttpRequest, team: str, data: MemberIn | None = None) -> JsonResponse:
    """Add a member (201) or change a member's role (200): team admins only."""
    found = actions.check_manage(request.user, team)
    data = data or MemberIn()
    member, new = actions.do_set_member(request.user, found, data.username, data.role)
    return JsonResponse(_member(member), status=201 if new else 200)


class Removed(Schema):
    removed: str


@router.delete(
    "/teams/{str:team}/members/{str:username}",
    url_name="team-member",
    response=responses(Removed, 200, 400, 403, 404, 409),
)
def remove_member(request: HttpRequest, team: str, username: str) -> JsonResponse:
    """Remove a member: team admins only."""
    found = actions.check_manage(request.user, team)
    user = actions.do_remove_member(request.user, found, username)
    return JsonResponse({"removed": user.username})


class Audit(Schema):
    events: list[dict[str, Any]]
    next: str | None


@router.get(
    "/teams/{str:team}/audit",
    url_name="team-audit",
    response=responses(Audit, 200, 400, 403, 404),
    openapi_extra=query_doc(("before", "integer", "only events with a smaller id (the next page)")),
)
def read_audit_log(request: HttpRequest, team: str) -> JsonResponse:
    """The team's audit log, newest first, 100 a page: team admins only."""
    found = actions.check_manage(request.user, team)
    before = int_param(request, "before", None, lo=1)
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
