"""Strict environment readers: a malformed setting is an error naming the variable."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from foundation.env import env_bool, env_int, env_list, env_str


@pytest.mark.parametrize(
    "raw, expected", [("1", True), ("TRUE", True), ("on", True), ("0", False), ("no", False), (" off ", False)]
)
def test_booleans_accept_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("DJANGO_DEBUG", raw)
    assert env_bool("DJANGO_DEBUG", not expected) is expected


def test_a_bad_boolean_is_an_error_not_false(monkeypatch):
    monkeypatch.setenv("DJANGO_DEBUG", "flase")
    with pytest.raises(ImproperlyConfigured, match=r"DJANGO_DEBUG must be one of .* \(got 'flase'\)"):
        env_bool("DJANGO_DEBUG", False)


def test_unset_or_empty_means_the_default(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert env_str("RAY_ADDRESS") is None
    monkeypatch.setenv("RAY_ADDRESS", "  ")
    assert env_str("RAY_ADDRESS", "auto") == "auto"
    monkeypatch.setenv("X_FLAG", "")
    assert env_bool("X_FLAG", True) is True


def test_lists_split_on_commas(monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOWED_HOSTS", "a.example, b.example,,")
    assert env_list("DJANGO_ALLOWED_HOSTS", []) == ["a.example", "b.example"]


def test_a_bad_integer_names_the_variable(monkeypatch):
    monkeypatch.setenv("ROLLWAY_STARTING_GRACE_S", "3m")
    with pytest.raises(ImproperlyConfigured, match="ROLLWAY_STARTING_GRACE_S must be an integer"):
        env_int("ROLLWAY_STARTING_GRACE_S", 180)


def test_settings_default_to_one_machine_with_nothing_installed(settings):
    # The embedded defaults of docs/configuration.md's Settings table (only checked where the
    # environment does not override them).
    import os

    if not os.environ.get("CELERY_BROKER_URL"):
        assert settings.CELERY_BROKER_URL == "filesystem://"
        opts = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        assert opts["data_folder_in"] == opts["data_folder_out"]
        assert opts["polling_interval"] == 0.05
    assert settings.CELERY_WORKER_REDIRECT_STDOUTS is False
    assert settings.MIGRATION_MODULES == {
        "teams": "migrations.teams",
        "runs": "migrations.runs",
        "configs": "migrations.configs",
        "compare": "migrations.compare",
    }
    assert str(settings.ROLLWAY_HOME / "cache") == settings.ROLLWAY_CACHE_DIR


def test_a_checkpoint_root_in_a_store_whose_filesystem_is_missing_stops_the_site_naming_the_extra(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "ROLLWAY_HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "rollway.settings",
        "PYTHONPATH": os.pathsep.join([str(repo / "platform"), str(repo)]),
        "ROLLWAY_CHECKPOINT_ROOT": "s3://bucket/checkpoints",
    }
    # s3fs as not installed, whether it is here or not.
    code = "import sys; sys.modules['s3fs'] = None; import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert (
        "ROLLWAY_CHECKPOINT_ROOT: checkpoint location 's3://bucket/checkpoints' needs s3fs, which is not installed: "
        "pip install 'rollway[s3]'"
    ) in done.stderr
    env["ROLLWAY_CHECKPOINT_ROOT"] = str(tmp_path / "checkpoints")
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0
