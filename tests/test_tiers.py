"""The engine's tiers: each subpackage of workers/ stands on a tier and imports only from
the tiers below it (and from itself), as tests/test_layers.py holds the site's floors.

From the ground up:

0. core: the records from inference to the loss, the shared vocabulary, process facts
1. rl_tasks: tasks, their reward functions, tools (what a user's task module imports)
2. config: the typed run config, presets, the config reference
3. model: loading through transformers, LoRA, log-probabilities, tokenizers
4. sync: weight sync protocols from trainer to inference
5. inference: generation backends (torch, transformers, vLLM)
6. rollout: task data, generation, episodes, reward scoring, evaluation
7. train: trainer, ranks, loss, warm start, export
8. run: admission, placement, actors, driver, buffer, checkpoints, failures, reporter
9. simulate: a whole run's timing at a scale no test machine has

sync stands below inference because a backend takes weights through a sync protocol
(vLLM's weight-transfer engines are the protocols' receiving ends), never the reverse.
Every import counts, one inside a function too.
"""

from __future__ import annotations

import ast

from tests.test_import_cycles import REPO, imports, modules
from tests.test_layers import upward_imports

WORKERS = REPO / "workers"
TIERS = {
    "core": 0,
    "rl_tasks": 1,
    "config": 2,
    "model": 3,
    "sync": 4,
    "inference": 5,
    "rollout": 6,
    "train": 7,
    "run": 8,
    "simulate": 9,
}


def engine_graph() -> dict[str, set[str]]:
    """Each engine module's imports of other engine modules, named without `workers.`."""
    mods = {name.removeprefix("workers."): path for name, path in modules(REPO, ("workers",)).items()}
    full = {f"workers.{name}" for name in mods if name != "workers"}
    return {
        name: {target.removeprefix("workers.") for target in imports(f"workers.{name}", path, full)}
        for name, path in mods.items()
        if name != "workers"
    }


def test_every_module_of_the_engine_stands_in_a_tier():
    loose = sorted(p.name for p in WORKERS.glob("*.py") if p.name != "__init__.py")
    assert loose == [], "move each module into the tier it belongs to (see TIERS)"
    packages = {p.name for p in WORKERS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(TIERS), "give each subpackage of workers/ a tier in TIERS (and say why there)"


def test_no_import_of_the_engine_runs_up_a_tier():
    graph = engine_graph()
    assert sum(map(len, graph.values())) > 200  # the imports were read
    assert upward_imports(graph, TIERS) == []


def test_each_tier_says_what_lives_there_and_what_it_may_import():
    for tier in TIERS:
        doc = ast.get_docstring(ast.parse((WORKERS / tier / "__init__.py").read_text())) or ""
        assert len(doc.split()) >= 20, f"workers/{tier}/__init__.py: say in a paragraph what lives there"
        assert "import" in doc, f"workers/{tier}/__init__.py: say which tiers it may import"


# At most this many imports of the engine's own modules inside functions per thousand
# lines of workers/: each one hides an edge of the graph from a reader of the module's
# head, so the few left must each say why (a heavy library on a path that never needs
# it, a library that must wait for its environment).
INNER_IMPORTS_PER_KLOC = 1


def inner_engine_imports() -> list[tuple[str, int]]:
    """(module path, line) of each import of a workers module inside a function."""
    found = set()
    for path in sorted(WORKERS.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if node.level == 0 else []
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                if any(name == "workers" or name.startswith("workers.") for name in names):
                    found.add((str(path.relative_to(REPO)), node.lineno))
    return sorted(found)


def says_why(lines: list[str], lineno: int) -> bool:
    """Whether the import at `lineno` (1-based) carries a comment: on its line, or above
    the run of imports it stands in."""
    if "#" in lines[lineno - 1]:
        return True
    in_parens = False  # walking up through a parenthesised `from x import (…)`
    for line in reversed(lines[: lineno - 1]):
        text = line.strip()
        if in_parens:
            in_parens = not (text.startswith("from ") and text.endswith("("))
            continue
        if text.startswith("#"):
            return True
        if text == ")":
            in_parens = True
            continue
        if text and not text.startswith(("from ", "import ")):
            return False
    return False


def test_the_engine_imports_its_own_modules_at_the_top():
    found = inner_engine_imports()
    kloc = sum(len(p.read_text().splitlines()) for p in WORKERS.rglob("*.py")) / 1000
    print(f"{len(found)} imports of the engine inside functions in {kloc:.1f}k lines of workers/")
    assert found, "no import inside a function was read: check inner_engine_imports"
    assert len(found) <= INNER_IMPORTS_PER_KLOC * kloc, (
        f"{len(found)} imports of the engine inside functions, more than {INNER_IMPORTS_PER_KLOC} per thousand "
        "lines: move them to the module's head (tests/test_import_cycles.py says where that closes a loop)"
    )
    texts = {path: (REPO / path).read_text().splitlines() for path, _ in found}
    silent = [f"{path}:{line}" for path, line in found if not says_why(texts[path], line)]
    assert silent == [], "say in a comment above each import inside a function why it is there"
