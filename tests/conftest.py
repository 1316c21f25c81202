"""What the whole suite shares: how `make test` spreads it over pytest-xdist workers."""

from __future__ import annotations

from pathlib import Path

import pytest

ENGINE = Path(__file__).parent / "engine"
# Fixtures held for a module or class (a vLLM engine, a private PostgreSQL, a trained
# checkpoint) cost seconds to minutes each; a worker that runs one of their tests starts
# its own copy.
SHARED_SCOPES = ("module", "class")


# The engine's in-process Ray cluster (tests/engine/conftest.py). Its tests run whole RL
# runs that keep both cores busy, waiting at most a minute or two for each phase: spread
# over three workers at once, twelve of them took as long as one after another and nine
# timed out (tests/engine/test_driver.py and test_eval_runs.py, load average 60). On one
# worker they also share one cluster instead of starting one per worker.
RAY_GROUP = "engine-ray-cluster"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`: every test on the engine's Ray cluster goes to one worker;
    the tests of a file that use a module- or class-scoped fixture of that file go to one
    worker (xdist_group named by the file), so the fixture starts once; every other test
    goes to whichever worker is free. A test on the engine's Ray cluster is marked slow too."""
    for item in items:
        if item.get_closest_marker("xdist_group") or not isinstance(item, pytest.Function):
            continue
        if "cluster" in item.fixturenames and item.path.is_relative_to(ENGINE):
            item.add_marker(pytest.mark.xdist_group(RAY_GROUP))
            # It starts Ray, as "slow" says: `make test-fast` leaves it out.
            item.add_marker(pytest.mark.slow)
            continue
        path = item.nodeid.split("::", 1)[0]
        # pytest keeps no public map of an item's fixture definitions; _fixtureinfo is what
        # pytest-xdist and pytest-django read too.
        for defs in item._fixtureinfo.name2fixturedefs.values():
            if any(d.scope in SHARED_SCOPES and d.baseid == path for d in defs):
                item.add_marker(pytest.mark.xdist_group(path))
                break
