"""The teams page: each of the user's teams, its members, roles and quotas; for the team's
admins, forms to add members, change roles and remove members, and the audit log; for a
site admin, the form that creates a team."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from foundation.errors import ActionError, Forbidden, NotFound
from teams import actions, quotas, roles, tokens
from teams.models import ApiToken, AuditEvent, Membership, Team

AUDIT_SHOWN = 100  # the newest events; GET /api/teams/<team>/audit pages through all


@login_required
def teams(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _page(
    request: HttpRequest,
    *,
    new_secret: str = "",
    token_errors: dict | None = None,
    team_errors: dict | None = None,
    team_form: dict | None = None,
) -> HttpResponse:
    entries = []
    for team in Team.objects.for_user(request.user).order_by("name"):
        role = roles.role_of(request.user, team)
        admin = roles.allows(role, "manage members")
        entries.append(
            {
                "team": team,
                "role": role,
                "admin": admin,
                "members": team.memberships.select_related("user").order_by("user__username"),
                "events": AuditEvent.objects.filter(team=team)[:AUDIT_SHOWN] if admin else [],
                "quotas": quotas.quotas(team),
                "priority_range": quotas.priority_range(role) if roles.allows(role, "launch runs") else None,
            }
        )
    context = {
        "entries": entries,
        "roles": Membership.Role.choices,
        "tokens": ApiToken.objects.filter(user=request.user).select_related("team"),
        # Shown this once, in the answer to the form that made it (never stored, never
        # put in a redirect or a flash message).
        "new_secret": new_secret,
        "token_errors": token_errors or {},
        "site_admin": actions.is_site_admin(request.user),
        "team_errors": team_errors or {},
        "team_form": team_form or {},
    }
    return render(request, "teams/teams.html", context, status=400 if token_errors or team_errors else 200)


@login_required
@require_POST
def new_team(request: HttpRequest) -> HttpResponse:
    """A site admin's form: `name`, `slug` (optional) and `admin` (optional: the first
    admin's username or email; the creator by default)."""
    given = {field: request.POST.get(field, "") for field in ("name", "slug", "admin")}
    try:
        name, slug, admin = actions.check_new_team(request.user, **given)
    except Forbidden as exc:
        return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain; charset=utf-8")
    except ActionError as exc:  # the page again, each message beside its field (409: a taken slug)
        response = _page(request, team_errors=exc.errors, team_form=given)
        response.status_code = exc.http_status
        return response
    actions.do_create_team(request.user, name, slug, admin)
    messages.info(request, f"Created team {name} ({slug}) with {admin.username} as its admin.")
    return redirect("teams:list")


@login_required
@require_POST
def new_token(request: HttpRequest) -> HttpResponse:
    try:
        team, role, name = tokens.check_new(
            request.user, team=request.POST.get("team"), role=request.POST.get("role"), name=request.POST.get("name")
        )
    except ActionError as exc:
        return _page(request, token_errors=exc.errors)
    _, secret = tokens.do_create(request.user, team, role, name)
    return _page(request, new_secret=secret)


@login_required
@require_POST
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = tokens.check_own(request.user, token_id)
    except NotFound:
        raise Http404("No such token of yours.") from None
    tokens.do_revoke(token)
    messages.info(request, f"Revoked token {token.name} ({token.prefix}…).")
    return redirect("teams:list")


@login_required
@require_POST
def members(request: HttpRequest, slug: str) -> HttpResponse:
    """The admin's forms: `action` add (username, role), role (username, role) or remove
    (username)."""
    try:
        team = actions.check_manage(request.user, slug)
    except NotFound:
        raise Http404("No such team among yours.") from None
    except ActionError as exc:
        return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain; charset=utf-8")
    username = request.POST.get("username", "")
    try:
        if request.POST.get("action") == "remove":
            user = actions.do_remove_member(request.user, team, username)
            messages.info(request, f"Removed {user.username} from {team.name}.")
        else:
            member, new = actions.do_set_member(request.user, team, username, request.POST.get("role"))
            verb = "Added" if new else "Set"
            messages.info(request, f"{verb} {member.user.username} as {member.role} in {team.name}.")
    except ActionError as exc:
        # The page again with the refusal's status (400 unknown user or role, 404 not a
        # member, 409 the last admin), its message naming the field at the top.
        messages.error(request, "; ".join(f"{field}: {text}" for field, text in exc.errors.items()))
        response = _page(request)
        response.status_code = exc.http_status
        return response
    return redirect("teams:list")
