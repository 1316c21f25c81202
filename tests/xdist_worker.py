"""What each pytest-xdist worker (`make test` runs the suite with `-n`) keeps to itself.

pytest-django already gives each worker its own test database (`test_<name>_gw0`, ...) and
xdist its own tmp_path root; Ray clusters and heads are private per process already
(in-process `ray.init(address="local")`, `ray start` on free ports). What is left is shared
by name, so it is made per worker here:

- Redis: REDIS_URL (channel layer) and CELERY_BROKER_URL (the integration tests' Celery
  worker) move up by the span of their databases per worker: with the Makefile's 1 and 2,
  gw0 keeps 1 and 2, gw1 takes 3 and 4, gw2 5 and 6. Otherwise one worker's Celery worker
  takes another's launch (both count runs from id 1) and a session's purge empties the
  other's queue.
- ROLLWAY_HOME: `<home>/xdist-gw1`, as run logs, exports and spools are kept there by run
  id, and every worker's database counts runs from 1.
- The cores: torch computes in each worker on its share of them (`worker_threads`), not
  on every core beside the other workers' tests and runs.

Loaded with `-p` (pyproject.toml's addopts) so it runs before pytest-django reads the
settings; the rewritten environment is also what every service a test starts inherits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

REPO = Path(__file__).resolve().parents[1]
REDIS_SETTINGS = ("REDIS_URL", "CELERY_BROKER_URL")
REDIS_DATABASES = 16  # redis.conf's `databases` default, which the Makefile's Redis keeps


def worker_index() -> int | None:
    """0 for gw0, 1 for gw1, ...; None outside an xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary root the workers of one pytest run share (a worker's own is
    <run's root>/popen-gwN), or the session's without xdist: where they keep what they
    build once for all of them (the runs' warm-start cache, a lock)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if worker_index() is not None else root


def ray_start_lock_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The file the workers of a pytest run, and the bench scripts they run (through
    RAY_START_LOCK_ENV), lock while a Ray cluster or head starts."""
    return str(run_root(tmp_path_factory) / "ray-start.lock")


@contextlib.contextmanager
def ray_start_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held while a Ray cluster or head starts, one at a time across the workers of a
    pytest run: Ray gives a raylet 30 s to register with its GCS, and clusters starting
    at once on a loaded 2-core machine missed it (a head that exits at start-up). The
    bench scripts' `init_local_ray` takes the same lock."""
    # Imported here: it imports Ray, and this plugin loads before pytest-django's settings.
    from workers.core.run_actors import ray_start_lock as start_lock

    with start_lock(ray_start_lock_path(tmp_path_factory)):
        yield


def _redis_db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path else 0


def worker_env(env: dict[str, str], index: int) -> dict[str, str]:
    """The settings worker `index` runs with, from the session's `env`."""
    changed: dict[str, str] = {}
    redis = {name: env[name] for name in REDIS_SETTINGS if env.get(name, "").startswith("redis://")}
    if redis:
        dbs = {name: _redis_db(url) for name, url in redis.items()}
        span = max(dbs.values()) - min(dbs.values()) + 1
        for name, url in redis.items():
            db = dbs[name] + index * span
            if db >= REDIS_DATABASES:
                raise pytest.UsageError(
                    f"{name}: xdist worker gw{index} would need Redis database {db}, past the "
                    f"server's {REDIS_DATABASES}: run fewer workers (-n) or start from lower databases"
                )
            changed[name] = urlunsplit(urlsplit(url)._replace(path=f"/{db}"))
    home = Path(env.get("ROLLWAY_HOME") or REPO / "var")
    changed["ROLLWAY_HOME"] = str(home / f"xdist-gw{index}")
    return changed


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    index = worker_index()
    if index is not None:
        os.environ.update(worker_env(dict(os.environ), index))


def worker_threads(cores: int, workers: int) -> int:
    """torch's threads in each of `workers` xdist workers on a host of `cores` cores."""
    return max(1, cores // max(1, workers))


def pytest_sessionstart(session):
    """torch's threads in this worker: its share of the cores. At torch's default (every
    core) each worker's in-process training and sampling ran two OpenMP threads on a
    2-core host beside the other worker's: `make test-fast` spent 255 s of CPU in 158 s,
    against 227 s in 143 s at one thread each (2026-11-30). A test that needs another
    count sets it; processes a test starts (Ray actors, scripts) choose their own."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker_index() is not None and workers.isdigit():
        import torch  # here, not at the top: this plugin loads before Django's settings are read

        torch.set_num_threads(worker_threads(os.cpu_count() or 1, int(workers)))
