"""The page listing a team's saved configurations and their versions."""

from __future__ import annotations

import json
from itertools import groupby

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from configs.actions import builtin_presets
from configs.models import SavedConfig


@login_required
def configs(request: HttpRequest) -> HttpResponse:
    found = (
        SavedConfig.objects.visible_to(request.user)
        .select_related("team", "created_by")
        .annotate(run_count=Count("runs"))
        .order_by("team__name", "name", "-version")
    )
    teams = []
    for team, versions in groupby(found, key=lambda saved: saved.team):
        named = [
            {"name": name, "versions": [(v, json.dumps(v.overrides)) for v in group]}
            for name, group in groupby(versions, key=lambda saved: saved.name)
        ]
        teams.append({"team": team, "configs": named})
    return render(request, "configs/list.html", {"teams": teams, "presets": builtin_presets()})
