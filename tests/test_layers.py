"""Each package of the site stands on a floor and imports only from the floors below it
(and from itself); the engine and the command line import nothing of Django or the site.

The floors, from the ground up:

0. foundation: errors, strict input, request guards, the adapters settings plug in
1. teams: who may see and do what (the access rules), the audit log, API tokens
2. configs: what a run config may ask for here, saved configurations
3. runs: launch, queue, Ray, reports, metrics
4. compare: comparisons of runs
5. the surfaces: dashboard (pages), api (JSON API and the engine's ingest), ops (`up`)
6. rollway: the Django project (settings, URLs, ASGI, Celery), the roof no app imports

Two packages on one floor do not import each other either: each surface stands on the
domain alone. The imports are read from the source as test_import_cycles.py reads them
(every import, also one inside a function), so a "lazy" import running up a floor fails
here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_cycles import REPO, imports, modules

PLATFORM = REPO / "platform"
FLOORS = {
    "foundation": 0,
    "teams": 1,
    "configs": 2,
    "runs": 3,
    "compare": 4,
    "dashboard": 5,
    "api": 5,
    "ops": 5,
    "rollway": 6,
}
# What the engine and the command line may never import: the site's packages and the
# web stack it runs on.
WEB_STACK = {"django", "channels", "channels_redis", "ninja", "daphne", "csp", "axes", "whitenoise"}


def upward_imports(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """ "a.x -> b.y" for each import of a module of package b from package a that does not
    stand on a floor below a's."""
    found = []
    for name, targets in sorted(graph.items()):
        package = name.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            if other != package and floors[other] >= floors[package]:
                found.append(f"{name} (floor {floors[package]}) -> {target} (floor {floors[other]})")
    return found


def top_level_imports(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def forbidden_imports(root: Path, forbidden: set[str]) -> list[str]:
    return [
        f"{path.relative_to(root.parent)} imports {name}"
        for path in sorted(root.rglob("*.py"))
        for name in sorted(top_level_imports(path) & forbidden)
    ]


def test_every_package_of_the_site_has_a_floor():
    packages = {p.name for p in PLATFORM.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert packages == set(FLOORS), "give each package of platform/ a floor in FLOORS (and say why it stands there)"


def test_no_import_of_the_site_runs_up_a_floor():
    mods = modules(PLATFORM, tuple(FLOORS))
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert sum(map(len, graph.values())) > 100  # the imports were read
    assert upward_imports(graph, FLOORS) == []


def test_the_engine_imports_nothing_of_django_or_the_site():
    assert len(list((REPO / "workers").rglob("*.py"))) > 20  # the engine was found
    assert forbidden_imports(REPO / "workers", WEB_STACK | set(FLOORS)) == []


def test_the_command_line_imports_nothing_of_django_or_the_site():
    """It speaks to the site over the JSON API only."""
    assert forbidden_imports(REPO / "rollway_cli", WEB_STACK | set(FLOORS)) == []


def test_the_checks_find_an_import_up_a_floor_or_sideways(tmp_path):
    for package, source in {
        "low": "def f():\n    from high import views\n",  # up, and lazily
        "high": "",
        "side": "import high.views\n",  # sideways: same floor
    }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(source)
        (tmp_path / package / "views.py").write_text("from low import helper\n")
        (tmp_path / package / "helper.py").write_text("")
    floors = {"low": 0, "high": 1, "side": 1}
    mods = modules(tmp_path, tuple(floors))
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert upward_imports(graph, floors) == [
        "low (floor 0) -> high.views (floor 1)",
        "side (floor 1) -> high.views (floor 1)",
    ]
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "driver.py").write_text("from django.db import models\nimport os\nimport low.helper\n")
    assert forbidden_imports(tmp_path / "engine", {"django", "low"}) == [
        "engine/driver.py imports django",
        "engine/driver.py imports low",
    ]
