"""Personal API tokens (teams/tokens.py).

GET    /api/tokens        your tokens (never their secrets)
POST   /api/tokens        {"team", "role", "name"} → 201 with "token": the secret, shown this once
DELETE /api/tokens/<id>   revoke one of yours
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_http_methods
from pydantic import BaseModel, ConfigDict, ValidationError

from api.http import api_login_required, json_object, refusal_response
from runs.errors import ActionError
from teams import tokens
from teams.models import ApiToken


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: Any = None
    role: Any = "viewer"
    name: Any = None


@require_http_methods(["GET", "POST"])
@api_login_required
def tokens_view(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        mine = ApiToken.objects.filter(user=request.user).select_related("team")
        return JsonResponse({"tokens": [t.as_dict() for t in mine]})
    try:
        data = TokenIn.model_validate(json_object(request))
        team, role, name = tokens.check_new(request.user, **data.model_dump())
    except (ValidationError, ActionError) as exc:
        return refusal_response(exc)
    token, secret = tokens.do_create(request.user, team, role, name)
    return JsonResponse({**token.as_dict(), "token": secret}, status=201)


@require_http_methods(["DELETE"])
@api_login_required
def token_view(request: HttpRequest, token_id: str) -> JsonResponse:
    try:
        token = tokens.check_own(request.user, token_id)
    except ActionError as exc:
        return refusal_response(exc)
    tokens.do_revoke(token)
    token.refresh_from_db()
    return JsonResponse(token.as_dict())
