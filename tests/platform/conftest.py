"""Personas and fakes for the platform tests.

Personas (healthchecks style): `owner` and `teammate` belong to team "Lab"; `outsider`
belongs to team "Elsewhere" only. Celery never runs here: `enqueued` records the
`.delay()` calls; tasks are called directly with `workers.driver` replaced by a fake.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from runs.models import Experiment, Run
from teams.models import Membership, Team
from workers.presets import build


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # PBKDF2 costs ~0.5 s per user on this machine; tests need no real hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings):
    # Also resets the layer between tests (channels listens to setting_changed), so no
    # queue outlives the event loop of the test that made it.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    """[(task name, run_id)] for every launch_run / cancel_run .delay()."""
    from runs import tasks

    calls: list[tuple[str, int]] = []

    class _Result:
        id = "fake-task-id"

    for name in ("launch_run", "cancel_run"):
        def delay(run_id, _name=name):
            calls.append((_name, run_id))
            return _Result()

        monkeypatch.setattr(getattr(tasks, name), "delay", delay)
    return calls


def _user(username: str):
    return get_user_model().objects.create_user(username, password="pw-" + username)


@pytest.fixture
def team(db):
    return Team.objects.create(name="Lab")


@pytest.fixture
def owner(team):
    user = _user("olga")
    Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER)
    return user


@pytest.fixture
def teammate(team):
    user = _user("tom")
    Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def outsider(db):
    user = _user("oscar")
    other = Team.objects.create(name="Elsewhere")
    Membership.objects.create(team=other, user=user, role=Membership.Role.OWNER)
    Experiment.objects.create(team=other, name="theirs")
    return user


@pytest.fixture
def experiment(team, owner):
    return Experiment.objects.create(team=team, name="async-vs-sync", created_by=owner)


@pytest.fixture
def make_run(experiment, owner):
    def make(status: str = Run.Status.QUEUED, preset: str = "async", **fields) -> Run:
        return Run.objects.create(
            experiment=fields.pop("experiment", experiment),
            name=fields.pop("name", f"{preset} run"),
            preset=preset,
            config=build(preset).model_dump(mode="json"),
            status=status,
            launched_by=owner,
            **fields,
        )

    return make


@pytest.fixture
def run(make_run):
    return make_run()


@pytest.fixture
def client_for(db):
    def login(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return login
