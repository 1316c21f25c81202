"""The JSON API fuzzed from its own OpenAPI document, with schemathesis.

The schema is fetched from /api/openapi.json through the in-process WSGI app (so the
document itself and its token auth are exercised too); then every operation it lists
gets requests schemathesis generates from it: valid ones (positive) and ones that break
the schema (negative: wrong types, missing or unknown fields), the valid ones to objects
that exist, the invalid ones to those and to any path value. They are sent as a team admin with a personal
API token (scripts need no CSRF token, so the POSTs and DELETEs reach their views).
Every answer must be < 500, conform to the schema where it is JSON the schema describes,
and no ERROR may be logged (Django logs an unhandled exception before its 500 page).

Each request runs in a savepoint rolled back after it, so every example meets the same
objects (a revoked token or a removed admin would stop the rest). Deterministic:
hypothesis is derandomized. `pytest tests/platform/test_openapi_fuzz.py -s` prints the
requests sent and the responses by status class.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from compare.models import Comparison, ComparisonRun
from configs.models import SavedConfig
from runs import exports
from runs.models import Experiment, Run
from teams import tokens
from teams.models import Membership, Team
from workers.config.presets import build

# Hypothesis and schemathesis runs over every route: `make test-fast` leaves them out.
pytestmark = pytest.mark.fuzz

Role = Membership.Role
# Per operation and generation mode: ~25 operations × 2 modes × this ≈ 650 requests,
# about a minute on a 2-core machine.
EXAMPLES = 12
FUZZ = hypothesis_settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture
def wsgi_app():
    """The site as a WSGI app, on the test's own database connection: Django closes
    "old" connections as each request starts and ends, which inside the test's
    transaction would end it (Django's test client disconnects the same handlers)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def existing(db, settings, tmp_path) -> dict[str, str]:
    """Objects to aim at: path parameter name → the value of one that exists."""
    settings.ROLLWAY_EXPORT_DIR = str(tmp_path / "exports")
    make = get_user_model().objects.create_user
    admin, member = make("olga", password="x"), make("vera", password="x")
    team = Team.objects.create(name="Lab")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    Membership.objects.create(team=team, user=member, role=Role.MEMBER)
    experiment = Experiment.objects.create(team=team, name="e", created_by=admin)
    done = Run.objects.create(
        experiment=experiment,
        name="done",
        preset="sync",
        config=build("sync").model_dump(mode="json"),
        status=Run.Status.SUCCEEDED,
        launched_by=admin,
    )
    export = Path(exports.export_dir(done.pk))
    export.mkdir(parents=True)
    (export / exports.MARKER).write_text("{}")
    comparison = Comparison.objects.create(
        team=team, experiment=experiment, name="c", created_by=admin, configurations=["sync"], seeds=[0]
    )
    ComparisonRun.objects.create(comparison=comparison, run=done, configuration="sync")
    saved = SavedConfig.objects.create(team=team, name="s", version=1, base_preset="sync", overrides={})
    other_token, _ = tokens.do_create(admin, team, "viewer", "another")
    _, secret = tokens.do_create(admin, team, "admin", "fuzz")
    return {
        "secret": secret,
        "run_id": str(done.pk),
        "comparison_id": str(comparison.pk),
        "config_id": str(saved.pk),
        "team": team.slug,
        "username": member.username,
        "token_id": str(other_token.pk),
        "row": "2",  # a plan's row: the run holds no plan, a 400 by name
    }


@pytest.mark.usefixtures("short_league_simulations")
def test_no_generated_request_gets_a_5xx_or_breaks_the_schema(wsgi_app, existing, caplog, capsys):
    headers = {"Authorization": f"Bearer {existing['secret']}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", wsgi_app, headers=headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, "the schema lists the API's operations"
    statuses: Counter[int] = Counter()
    caplog.set_level(logging.ERROR)

    for operation in operations:
        names = {p.name for p in operation.path_parameters}
        aimed = {name: existing[name] for name in names}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            cases = operation.as_strategy(generation_mode=mode)
            if aimed:
                # Valid requests at objects that exist (a random id is only ever a 404);
                # invalid ones at those and at any path value.
                at_existing = operation.as_strategy(generation_mode=mode, path_parameters=aimed)
                cases = at_existing if mode == GenerationMode.POSITIVE else st.one_of(cases, at_existing)

            @FUZZ
            @given(case=cases)
            def fuzz(case):
                with transaction.atomic():
                    response = case.call(headers=headers)
                    transaction.set_rollback(True)
                statuses[response.status_code] += 1
                case.validate_response(response, checks=CHECKS)
                errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
                assert not errors, f"{case.method} {case.formatted_path}: {errors[0].getMessage()}"

            fuzz()

    by_class = Counter(f"{status // 100}xx" for status in statuses.elements())
    with capsys.disabled():
        print(
            f"\nopenapi fuzz: {len(operations)} operations, {sum(statuses.values())} requests; "
            f"by class {dict(sorted(by_class.items()))}; by status {dict(sorted(statuses.items()))}"
        )
    assert by_class["5xx"] == 0


def test_the_schema_is_valid_openapi_and_describes_the_api(client, existing):
    from openapi_spec_validator import validate

    r = client.get("/api/openapi.json", HTTP_AUTHORIZATION=f"Bearer {existing['secret']}")
    assert r.status_code == 200, r.content
    document = r.json()
    validate(document)  # raises, naming the part that is not OpenAPI 3
    assert document["openapi"].startswith("3.")
    launch = document["paths"]["/api/runs"]["post"]
    assert launch["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/LaunchIn"}
    listed = {p["name"] for p in document["paths"]["/api/runs"]["get"]["parameters"]}
    assert {"status", "q", "sort", "page", "page_size"} <= listed
    tags = {tag for ops in document["paths"].values() for op in ops.values() for tag in op["tags"]}
    assert tags == {"runs", "metrics", "presets", "configs", "comparisons", "experiments", "teams", "tokens", "exports"}
    assert set(document["components"]["securitySchemes"]) == {"ApiToken", "SessionUser"}
