"""The permission rules the matrices ask by (test_permission_matrix.py: one team;
test_two_team_matrix.py: two teams side by side): every route's requests (`ASKS`,
`WS_ASKS`), who each one is for (`allowed`), and the world of one team they are asked in
(`populate`). One table, so a new route gets its rule once and both matrices ask it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from compare.models import Comparison, ComparisonRun
from configs.models import SavedConfig
from runs import exports
from runs.models import Checkpoint, Experiment, Run, RunSchedule
from teams.models import ApiToken, AuditEvent, Membership, Team
from workers.config.presets import build

Role = Membership.Role
# Personal API tokens (the JSON API only: on a page a token is no one): the admin's token
# with each role, the member's own, and a revoked one. persona → (maker, role).
TOKENS = {
    "admin-token": ("admin", "admin"),
    "member-token": ("member", "member"),
    "viewer-token": ("admin", "viewer"),
    "revoked-token": ("admin", "admin"),
}
RANK = {"viewer": 0, "member": 1, "admin": 2}
SKIPPED_NAMESPACES = {"admin"}  # Django's admin: its scoping is tested in test_roles.py
SKIPPED_NAMES = {  # django.contrib.auth's views: the login form and password pages
    "login",
    "logout",
    "password_change",
    "password_change_done",
    "password_reset",
    "password_reset_done",
    "password_reset_confirm",
    "password_reset_complete",
}


@dataclass(frozen=True)
class Ask:
    """One request to one route: `needs` is "public", "login" (any signed-in user; what
        it lists is scoped to their teams), "site" (a site admin: Django staff, in a team or
    not; refused with a 403 to everyone else signed in), a role ("viewer", "member", "admin"), "own" (a
        member their own run, an admin anyone's), "session" (a signed-in person, not a
        token: making tokens), "self" (the token's own maker) or "token" (the engine's
        bearer token only). `json`: an API route (anonymous gets 401, not a login redirect). `form`: a
        page form that reports a refusal on the page it redirects to (302 either way), so
        only what is stored tells allowed from refused."""

    method: str
    path: Callable[[World], str]
    needs: str
    body: Callable[[World], dict] | None = None
    json: bool = True
    form: bool = False


@dataclass
class World:
    team: Team
    users: dict
    experiment: Experiment
    run: Run  # running, launched by the member
    done: Run  # succeeded, with an exported model
    comparison: Comparison
    saved: SavedConfig
    planned: Run  # simulated by the admin, holding a plan's table of two rows
    secrets: dict[str, str]  # persona → personal API token
    own_token: int  # the id of the admin's "admin-token": only its maker may revoke it


def _launch_body(w: World) -> dict:
    return {"experiment": w.experiment.pk, "preset": "sync", "name": "matrix"}


ASKS: dict[str, list[Ask]] = {
    "healthz": [Ask("GET", lambda w: "/healthz", "public")],
    "api:openapi-json": [Ask("GET", lambda w: "/api/openapi.json", "login")],
    "api:openapi-view": [Ask("GET", lambda w: "/api/docs", "login", json=False)],
    "api:presets": [Ask("GET", lambda w: "/api/presets", "login")],
    "api:config-schema": [Ask("GET", lambda w: "/api/config/schema", "login")],
    "api:teams": [
        Ask("GET", lambda w: "/api/teams", "login"),
        Ask("POST", lambda w: "/api/teams", "site", lambda w: {"name": "Fresh Team"}),
    ],
    "api:configs": [
        Ask("GET", lambda w: "/api/configs", "login"),
        Ask(
            "POST",
            lambda w: "/api/configs",
            "member",
            lambda w: {"team": w.team.slug, "name": "new", "base_preset": "sync"},
        ),
    ],
    "api:tokens": [
        Ask("GET", lambda w: "/api/tokens", "login"),
        Ask("POST", lambda w: "/api/tokens", "session", lambda w: {"team": w.team.slug, "role": "viewer", "name": "n"}),
    ],
    "api:token": [Ask("DELETE", lambda w: f"/api/tokens/{w.own_token}", "self")],
    "teams:new-token": [
        Ask(
            "POST",
            lambda w: "/teams/tokens/",
            "session",
            lambda w: {"team": w.team.slug, "role": "viewer", "name": "n"},
            json=False,
        )
    ],
    "teams:new-team": [Ask("POST", lambda w: "/teams/new/", "site", lambda w: {"name": "Fresh Team"}, json=False)],
    "teams:revoke-token": [Ask("POST", lambda w: f"/teams/tokens/{w.own_token}/revoke/", "self", json=False)],
    "api:config": [Ask("GET", lambda w: f"/api/configs/{w.saved.pk}", "viewer")],
    "api:config-versions": [
        Ask("POST", lambda w: f"/api/configs/{w.saved.pk}/versions", "member", lambda w: {"description": "v2"})
    ],
    "api:comparisons": [
        Ask("GET", lambda w: "/api/comparisons", "login"),
        Ask(
            "POST",
            lambda w: "/api/comparisons",
            "member",
            lambda w: {"team": w.team.slug, "name": "cmp", "configurations": ["sync"], "seeds": [0]},
        ),
    ],
    "api:comparison": [Ask("GET", lambda w: f"/api/comparisons/{w.comparison.pk}", "viewer")],
    "api:comparison-rerun": [
        Ask("POST", lambda w: f"/api/comparisons/{w.comparison.pk}/rerun", "member", lambda w: {"seeds": [5]})
    ],
    "api:comparison-league": [Ask("GET", lambda w: f"/api/comparisons/{w.comparison.pk}/league", "viewer")],
    "api:comparison-league-simulate": [
        Ask("POST", lambda w: f"/api/comparisons/{w.comparison.pk}/league/simulate", "member", lambda w: {})
    ],
    "api:team-members": [
        Ask("GET", lambda w: f"/api/teams/{w.team.slug}/members", "viewer"),
        Ask(
            "POST",
            lambda w: f"/api/teams/{w.team.slug}/members",
            "admin",
            lambda w: {"username": "newbie", "role": "viewer"},
        ),
    ],
    "api:team-member": [Ask("DELETE", lambda w: f"/api/teams/{w.team.slug}/members/vera", "admin")],
    "api:team-audit": [Ask("GET", lambda w: f"/api/teams/{w.team.slug}/audit", "admin")],
    "api:experiments": [
        Ask("GET", lambda w: "/api/experiments", "login"),
        Ask("POST", lambda w: "/api/experiments", "member", lambda w: {"team": w.team.slug, "name": "another"}),
    ],
    "api:runs": [
        Ask("GET", lambda w: "/api/runs", "login"),
        Ask("POST", lambda w: "/api/runs", "member", _launch_body),
    ],
    # Who may launch may simulate: a launch's body plus a small cluster and few steps.
    "api:simulations": [
        Ask(
            "POST",
            lambda w: "/api/simulations",
            "member",
            lambda w: _launch_body(w) | {"cluster": {"gpus": 8}, "workload": {"median_tokens": 256}, "steps": 3},
        )
    ],
    # Who may launch may plan: the same body; 8 GPUs and few steps keep the search short.
    "api:simulations-plan": [
        Ask(
            "POST",
            lambda w: "/api/simulations/plan",
            "member",
            lambda w: _launch_body(w) | {"cluster": {"gpus": 8}, "workload": {"median_tokens": 256}, "steps": 3},
        )
    ],
    "api:runs-cancel": [Ask("POST", lambda w: "/api/runs/cancel", "own", lambda w: {"runs": [w.run.pk]}, form=True)],
    "api:run": [Ask("GET", lambda w: f"/api/runs/{w.run.pk}", "viewer")],
    "api:run-cancel": [Ask("POST", lambda w: f"/api/runs/{w.run.pk}/cancel", "own")],
    "api:run-log": [Ask("GET", lambda w: f"/api/runs/{w.run.pk}/log", "viewer")],
    "api:run-log-download": [Ask("GET", lambda w: f"/api/runs/{w.run.pk}/log/download", "viewer")],
    "api:run-metrics": [
        Ask("GET", lambda w: f"/api/runs/{w.run.pk}/metrics", "viewer"),
        Ask(
            "POST",
            lambda w: f"/api/runs/{w.run.pk}/metrics",
            "token",
            lambda w: {"points": [{"series": "reward/mean", "step": 1, "value": 0.5}]},
        ),
    ],
    "api:run-status": [
        Ask("POST", lambda w: f"/api/runs/{w.run.pk}/status", "token", lambda w: {"status": "failed", "error": "x"})
    ],
    "api:run-schedule": [
        Ask(
            "POST",
            lambda w: f"/api/runs/{w.run.pk}/schedule",
            "token",
            lambda w: {"admissions": [[0, 0, 1]], "batches": [[0, ["w0-0"]]]},
        )
    ],
    "api:run-placement": [
        Ask(
            "POST",
            lambda w: f"/api/runs/{w.run.pk}/placement",
            "token",
            lambda w: {
                "actors": [
                    {
                        "actor": "trainer",
                        "node_id": "ab" * 28,
                        "node_ip": "10.0.0.5",
                        "labels": {},
                        "gpu_ids": [],
                        "cuda_visible_devices": "",
                        "pid": 1,
                    }
                ]
            },
        )
    ],
    "api:run-export": [Ask("GET", lambda w: f"/api/runs/{w.done.pk}/export", "member")],
    "api:run-plan-row": [Ask("POST", lambda w: f"/api/runs/{w.planned.pk}/plan/2", "member")],
    "api:run-retry": [Ask("POST", lambda w: f"/api/runs/{w.done.pk}/retry", "member")],
    "api:run-replay": [Ask("POST", lambda w: f"/api/runs/{w.done.pk}/replay", "member")],
    "api:run-resume": [Ask("POST", lambda w: f"/api/runs/{w.done.pk}/resume", "member", lambda w: {"step": 1})],
    "api:run-clone": [
        Ask("POST", lambda w: f"/api/runs/{w.done.pk}/clone", "member", lambda w: {"overrides": {"seed": 3}})
    ],
    "api:run-notes": [Ask("POST", lambda w: f"/api/runs/{w.run.pk}/notes", "own", lambda w: {"notes": "n"})],
    "api:run-checkpoints": [
        Ask("GET", lambda w: f"/api/runs/{w.done.pk}/checkpoints", "viewer"),
        Ask(
            "POST",
            lambda w: f"/api/runs/{w.run.pk}/checkpoints",
            "token",
            lambda w: {"step": 2, "location": "/ck/step-2", "bytes": 10, "sha256": "0" * 64},
        ),
    ],
    "compare:page": [Ask("GET", lambda w: f"/compare/?runs={w.run.pk},{w.done.pk}", "viewer", json=False)],
    "compare:api": [Ask("GET", lambda w: f"/api/compare?runs={w.run.pk},{w.done.pk}&series=", "viewer")],
    "compare:comparisons": [Ask("GET", lambda w: "/comparisons/", "login", json=False)],
    "compare:comparison-new": [
        Ask("GET", lambda w: "/comparisons/new/", "login", json=False),
        Ask(
            "POST",
            lambda w: "/comparisons/new/",
            "member",
            lambda w: {"target": str(w.experiment.pk), "name": "c", "configurations": ["sync"], "seeds": "0"},
            json=False,
        ),
    ],
    "compare:comparison": [Ask("GET", lambda w: f"/comparisons/{w.comparison.pk}/", "viewer", json=False)],
    "compare:comparison-league": [
        Ask("GET", lambda w: f"/comparisons/{w.comparison.pk}/league/", "viewer", json=False)
    ],
    "compare:comparison-league-simulate": [
        Ask(
            "POST",
            lambda w: f"/comparisons/{w.comparison.pk}/league/simulate/",
            "member",
            lambda w: {},
            json=False,
            form=True,
        )
    ],
    "compare:comparison-rerun": [
        Ask(
            "POST",
            lambda w: f"/comparisons/{w.comparison.pk}/rerun/",
            "member",
            lambda w: {"seeds": "7"},
            json=False,
            form=True,
        )
    ],
    "configs:list": [Ask("GET", lambda w: "/configs/", "login", json=False)],
    "teams:list": [Ask("GET", lambda w: "/teams/", "login", json=False)],
    "teams:members": [
        Ask(
            "POST",
            lambda w: f"/teams/{w.team.slug}/members/",
            "admin",
            lambda w: {"action": "role", "username": "vera", "role": "member"},
            json=False,
        )
    ],
    "dashboard:runs": [Ask("GET", lambda w: "/", "login", json=False)],
    "dashboard:runs-list": [Ask("GET", lambda w: "/runs/", "login", json=False)],
    "dashboard:launch": [
        Ask("GET", lambda w: "/runs/new/", "login", json=False),
        Ask(
            "POST",
            lambda w: "/runs/new/",
            "member",
            lambda w: {"experiment": str(w.experiment.pk), "preset": "sync", "overrides": "{}", "name": "m"},
            json=False,
        ),
    ],
    "dashboard:cancel-many": [
        Ask("POST", lambda w: "/runs/cancel/", "own", lambda w: {"runs": [str(w.run.pk)]}, json=False, form=True)
    ],
    "dashboard:run": [Ask("GET", lambda w: f"/runs/{w.run.pk}/", "viewer", json=False)],
    "dashboard:run-log": [Ask("GET", lambda w: f"/runs/{w.run.pk}/log/", "viewer", json=False)],
    "dashboard:cancel": [Ask("POST", lambda w: f"/runs/{w.run.pk}/cancel/", "own", json=False, form=True)],
    "dashboard:plan-row": [Ask("POST", lambda w: f"/runs/{w.planned.pk}/plan/2/", "member", json=False, form=True)],
    "dashboard:retry": [Ask("POST", lambda w: f"/runs/{w.done.pk}/retry/", "member", json=False, form=True)],
    "dashboard:replay": [Ask("POST", lambda w: f"/runs/{w.done.pk}/replay/", "member", json=False, form=True)],
    "dashboard:resume": [Ask("POST", lambda w: f"/runs/{w.done.pk}/resume/", "member", json=False, form=True)],
    "dashboard:notes": [
        Ask("POST", lambda w: f"/runs/{w.run.pk}/notes/", "own", lambda w: {"notes": "n"}, json=False, form=True)
    ],
}

WS_ASKS = {
    "ws/runs/": ("login", lambda w: "/ws/runs/"),
    "ws/runs/<int:run_id>/": ("viewer", lambda w: f"/ws/runs/{w.run.pk}/"),
}


def routes() -> dict[str, str]:
    """name → pattern of every URL route, walked from the URL configuration."""
    out: dict[str, str] = {}

    def walk(patterns, prefix: str, namespace: str | None) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                if p.namespace in SKIPPED_NAMESPACES:
                    continue
                walk(p.url_patterns, prefix + str(p.pattern), p.namespace or namespace)
            elif isinstance(p, URLPattern):
                if p.name in SKIPPED_NAMES and namespace is None:
                    continue
                out[f"{namespace}:{p.name}" if namespace else str(p.name)] = prefix + str(p.pattern)

    walk(get_resolver().url_patterns, "", None)
    return out


def ws_routes() -> list[str]:
    from runs.routing import websocket_urlpatterns

    return [str(p.pattern) for p in websocket_urlpatterns]


def allowed(persona: str, ask: Ask, w: World) -> bool:
    if ask.needs == "public":
        return True
    if ask.needs == "site":  # only the staff persona is a site admin (no token is theirs)
        return persona == "staff"
    if persona in TOKENS:
        if not ask.json or persona == "revoked-token":
            return False
        if ask.needs == "session":  # a token never makes tokens
            return False
        maker, cap = TOKENS[persona]
        role = min(maker, cap, key=RANK.__getitem__)  # the token's role, never above its maker's
        return _role_allows(role, maker, ask, w)
    if ask.needs == "token" or persona == "anonymous":
        return False
    if ask.needs == "login":
        return True
    if ask.needs == "session":  # a signed-in person, for one of their teams
        return persona in RANK
    if persona not in RANK:  # outsider, staff in no team
        return False
    return _role_allows(persona, persona, ask, w)


def _role_allows(role: str, who: str, ask: Ask, w: World) -> bool:
    """Whether `role` in the team allows `ask` to the team member `who`."""
    if ask.needs == "token":
        return False
    if ask.needs == "self":  # one's own token, whatever the role
        return who == "admin"
    if ask.needs == "login":
        return True
    if ask.needs == "own":
        return role == "admin" or (role == "member" and w.run.launched_by == w.users[who])
    return RANK[role] >= RANK[ask.needs]


def _tokens(users: dict, team: Team) -> dict[str, str]:
    from teams import tokens

    made, ids = {}, {}
    for persona, (maker, role) in TOKENS.items():
        token, made[persona] = tokens.do_create(users[maker], team, role, persona)
        ids[persona] = token.pk
        if persona == "revoked-token":
            tokens.do_revoke(token)
    return made, ids["admin-token"]


def populate(team: Team, users: dict, label: str, *, log_dir: Path, checkpoint_root: str) -> World:
    """The team's objects, each named `label`-something (so a body that shows one is
    found by its name): an experiment, a running run the member launched with its log,
    a succeeded one the admin launched with an exported model and a checkpoint, a
    comparison and a saved configuration; and the personal tokens of `TOKENS`.
    `users` maps "admin", "member" and "viewer" to the team's people."""
    for persona, role in (("admin", Role.ADMIN), ("member", Role.MEMBER), ("viewer", Role.VIEWER)):
        Membership.objects.create(team=team, user=users[persona], role=role)
    experiment = Experiment.objects.create(team=team, name=f"{label}-experiment", created_by=users["admin"])
    config = build("sync").model_dump(mode="json")

    def run(status: str, launcher) -> Run:
        return Run.objects.create(
            experiment=experiment,
            name=f"{label}-run-{status}",
            preset="sync",
            config=config,
            status=status,
            launched_by=launcher,
        )

    running, done = run(Run.Status.RUNNING, users["member"]), run(Run.Status.SUCCEEDED, users["admin"])
    export = Path(exports.export_dir(done.pk))
    export.mkdir(parents=True)
    (export / exports.MARKER).write_text("{}")
    log_dir.mkdir(exist_ok=True)
    (log_dir / f"run-{running.pk}.log").write_text("driver started\n")
    location = f"{checkpoint_root}/run-{done.pk}/step-1"
    Checkpoint.objects.create(run=done, step=1, location=location, bytes=10, sha256="0" * 64)
    groups = done.run_config.trainer.batch_groups  # one batch as the run took it: replayable
    batch = [f"w0-{i}" for i in range(groups)]
    RunSchedule.objects.create(run=done, admissions=[[0, 0, groups]], batches=[[0, batch]], bytes=40, steps=1)
    comparison = Comparison.objects.create(
        team=team,
        experiment=experiment,
        name=f"{label}-comparison",
        created_by=users["admin"],
        configurations=["sync"],
        seeds=[0],
    )
    ComparisonRun.objects.create(comparison=comparison, run=done, configuration="sync")
    saved = SavedConfig.objects.create(team=team, name=f"{label}-config", version=1, base_preset="sync", overrides={})
    return World(
        team,
        users,
        experiment,
        running,
        done,
        comparison,
        saved,
        _planned(experiment, users, done),
        *_tokens(users, team),
    )


def _planned(experiment: Experiment, users: dict, baseline: Run) -> Run:
    """A planned simulation as `simulation.do_plan` stores one: its cluster, workload and
    steps, and a table of two settings (the run's own, and one to simulate)."""

    def row(share: float, capacity: int) -> dict:
        return {
            "inference_share": share,
            "max_staleness": 0,
            "capacity": capacity,
            "protocol": "collective",
            "samples_per_s": 1.0,
            "seconds_to_goal": None,
            "trainer_busy": 0.5,
            "inference_busy": 0.5,
            "dropped_share": 0.0,
        }

    cluster = {"gpus": 8, "gpu": "H100", "model": "7B", "inference_share": 0.5, "tp": 1, "link": "InfiniBand"}
    workload = {"median_tokens": 256, "p90_tokens": 256, "max_tokens": 32768, "prompt_tokens": 512}
    plan = {
        "goal_samples": None,
        "steps": 3,
        "searched": 2,
        "baseline_run": baseline.pk,
        "candidates": [row(0.5, 2), row(0.25, 4)],
        "staleness_caveat": None,
    }
    overrides = {"buffer": {"max_staleness": 0, "capacity": 2}, "sync": {"protocol": "collective"}}
    return Run.objects.create(
        experiment=experiment,
        name=f"{experiment.name}-planned",
        preset="sync",
        overrides=overrides,
        config=build("sync", overrides).model_dump(mode="json"),
        status=Run.Status.SUCCEEDED,
        launched_by=users["admin"],
        simulated=True,
        simulation={"cluster": cluster, "workload": workload, "steps": 3, "summary": {}, "advice": [], "plan": plan},
    )


def stored() -> tuple:
    """Everything a request could change, in one comparable value."""
    return (
        tuple(Team.objects.order_by("pk").values_list("pk", "slug")),
        tuple(Run.objects.order_by("pk").values_list("pk", "status", "notes")),
        tuple(Checkpoint.objects.order_by("pk").values_list("pk", "step")),
        tuple(RunSchedule.objects.order_by("pk").values_list("pk", "batches")),
        Experiment.objects.count(),
        SavedConfig.objects.count(),
        Comparison.objects.count(),
        ComparisonRun.objects.count(),
        tuple(Membership.objects.order_by("pk").values_list("pk", "role")),
        AuditEvent.objects.count(),
        tuple(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
    )


def send(client: Client, ask: Ask, w: World, headers: dict):
    path, body = ask.path(w), ask.body(w) if ask.body else None
    if ask.method == "GET":
        return client.get(path, **headers)
    if ask.method == "DELETE":
        return client.delete(path, **headers)
    if ask.json:
        return client.post(path, data=json.dumps(body or {}), content_type="application/json", **headers)
    return client.post(path, data=body or {}, **headers)
