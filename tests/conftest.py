"""What the whole suite shares: how `make test` spreads it over pytest-xdist workers."""

from __future__ import annotations

import pytest

# Fixtures held for a module or class (a vLLM engine, a private PostgreSQL, a trained
# checkpoint) cost seconds to minutes each; a worker that runs one of their tests starts
# its own copy.
SHARED_SCOPES = ("module", "class")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, the tests of a file that use a module- or class-scoped
    fixture of that file go to one worker (xdist_group named by the file), so the fixture
    starts once; every other test goes to whichever worker is free, so a file of slow
    independent tests (tests/engine/test_driver.py: ten Ray runs) spreads over all of them.
    Fixtures of a conftest.py are left out: the engine's module-scoped `cluster` is one Ray
    per process whatever the module."""
    for item in items:
        if item.get_closest_marker("xdist_group") or not isinstance(item, pytest.Function):
            continue
        path = item.nodeid.split("::", 1)[0]
        # pytest keeps no public map of an item's fixture definitions; _fixtureinfo is what
        # pytest-xdist and pytest-django read too.
        for defs in item._fixtureinfo.name2fixturedefs.values():
            if any(d.scope in SHARED_SCOPES and d.baseid == path for d in defs):
                item.add_marker(pytest.mark.xdist_group(path))
                break
