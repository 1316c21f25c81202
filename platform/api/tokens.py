"""Personal API tokens (teams/tokens.py).

GET    /api/tokens        your tokens (never their secrets)
POST   /api/tokens        {"team", "role", "name"} → 201 with "token": the secret, shown this once
DELETE /api/tokens/<id>   revoke one of yours
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import BaseModel, ConfigDict

from api.openapi import responses
from teams import tokens
from teams.models import ApiToken

router = Router(tags=["tokens"])


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: Any = None
    role: Any = "viewer"
    name: Any = None


class Tokens(Schema):
    tokens: list[dict[str, Any]]


@router.get("/tokens", url_name="tokens", response=responses(Tokens))
def list_tokens(request: HttpRequest) -> JsonResponse:
    """Your tokens (never their secrets)."""
    mine = ApiToken.objects.filter(user=request.user).select_related("team")
    return JsonResponse({"tokens": [t.as_dict() for t in mine]})


@router.post("/tokens", url_name="tokens", response=responses(dict[str, Any], 201, 400, 403, 404))
def make_token(request: HttpRequest, data: TokenIn | None = None) -> JsonResponse:
    """Make a token for one team with a role no higher than yours: 201 with `token`, the
    secret, shown this once. Signed in with a session only (a token makes no tokens)."""
    team, role, name = tokens.check_new(request.user, **(data or TokenIn()).model_dump())
    token, secret = tokens.do_create(request.user, team, role, name)
    return JsonResponse({**token.as_dict(), "token": secret}, status=201)


@router.delete("/tokens/{str:token_id}", url_name="token", response=responses(dict[str, Any], 200, 404))
def revoke_token(request: HttpRequest, token_id: str) -> JsonResponse:
    """Revoke one of your tokens."""
    token = tokens.check_own(request.user, token_id)
    tokens.do_revoke(token)
    token.refresh_from_db()
    return JsonResponse(token.as_dict())
