"""The channel-layer, database-pool and operator-limit settings, read from the environment
in a fresh interpreter (settings are read once, at import)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOW = """
import json
from rollway import settings as s
db = s.DATABASES["default"]
print(json.dumps({"layer": s.CHANNEL_LAYERS["default"]["BACKEND"],
                  "prefix": s.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix"),
                  "pool": db.get("OPTIONS", {}).get("pool"), "health": db["CONN_HEALTH_CHECKS"]}))
"""


# Each of the engine's Limits beside the setting of its name and the default it has.
LIMITS = """
import dataclasses, json
from rollway import settings as s
from workers.run.admission import Limits
limits = dataclasses.fields(Limits)
print(json.dumps({f.name: [getattr(s, "ROLLWAY_" + f.name.upper(), None), f.default] for f in limits}))
"""


def settings_with(tmp_path, show: str = SHOW, **env: str) -> subprocess.CompletedProcess:
    unset = ("REDIS_URL", "DATABASE_URL", "DATABASE_POOL_SIZE")
    clean = {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("ROLLWAY_MAX_")}
    paths = [str(REPO / "platform"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    clean.update(ROLLWAY_HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(paths), **env)
    return subprocess.run([sys.executable, "-c", show], env=clean, capture_output=True, text=True, timeout=60)


def test_each_operator_limit_is_a_setting_whose_default_is_the_engines(tmp_path):
    shown = json.loads(settings_with(tmp_path, LIMITS).stdout)
    assert shown and all(setting == default for setting, default in shown.values()), shown
    overridden = json.loads(settings_with(tmp_path, LIMITS, ROLLWAY_MAX_STEPS="7").stdout)
    assert overridden["max_steps"][0] == 7


def test_the_pubsub_layer_gets_a_prefix_per_redis_database(tmp_path):
    r = settings_with(tmp_path, REDIS_URL="redis://127.0.0.1:6379/7")
    shown = json.loads(r.stdout)
    assert shown["layer"] == "foundation.channel_layer.PubSubChannelLayer"
    assert shown["prefix"] == "rollway.db7."
    assert json.loads(settings_with(tmp_path, REDIS_URL="redis://127.0.0.1:6379").stdout)["prefix"] == "rollway.db0."


def test_without_redis_the_layer_is_in_memory(tmp_path):
    shown = json.loads(settings_with(tmp_path).stdout)
    assert shown["layer"] == "channels.layers.InMemoryChannelLayer"


def test_a_negative_pool_size_names_the_variable(tmp_path):
    r = settings_with(tmp_path, DATABASE_URL="postgres://root@127.0.0.1:5432/x", DATABASE_POOL_SIZE="-1")
    assert r.returncode != 0
    assert "DATABASE_POOL_SIZE must be 0 (no pool) or more (got -1)" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("psycopg_pool") is not None, reason="psycopg_pool is installed")
def test_a_pool_without_psycopg_pool_says_what_to_install(tmp_path):
    r = settings_with(tmp_path, DATABASE_URL="postgres://root@127.0.0.1:5432/x", DATABASE_POOL_SIZE="4")
    assert r.returncode != 0
    assert "pip install 'psycopg[pool]'" in r.stderr
    # Unset, the pool is off where the package is missing: nothing to install to run.
    shown = json.loads(settings_with(tmp_path, DATABASE_URL="postgres://root@127.0.0.1:5432/x").stdout)
    assert shown["pool"] is None


@pytest.mark.skipif(importlib.util.find_spec("psycopg_pool") is None, reason="psycopg_pool is not installed")
def test_postgresql_gets_a_checked_pool_by_default(tmp_path):
    shown = json.loads(settings_with(tmp_path, DATABASE_URL="postgres://root@127.0.0.1:5432/x").stdout)
    assert shown["pool"] == {"min_size": 2, "max_size": 10, "timeout": 3}
    assert shown["health"] is True
