"""No module of the engine (workers/) or the site (platform/) imports itself back.

Every import counts, also one inside a function: a "lazy" import that closes a loop
still ties two modules into one concept a reader has to hold at once. The graph is read
from the source with `ast` (nothing is imported), one edge per module actually named:
`from workers.sync import lora` names workers.sync.lora, `from workers.sync import
make_sender` names workers.sync.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# (source root, top-level packages under it): platform/ is a source root, not a package.
TREES = {
    "workers": (REPO, ("workers",)),
    "platform": (
        REPO / "platform",
        ("foundation", "rollway", "runs", "teams", "configs", "compare", "api", "dashboard", "ops"),
    ),
}


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules in `known` that module `name` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph(tree: str) -> dict[str, set[str]]:
    root, packages = TREES[tree]
    mods = modules(root, packages)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


@pytest.mark.parametrize("tree", sorted(TREES))
def test_it_has_no_import_cycle(tree):
    graph = import_graph(tree)
    assert len(graph) > 5  # the tree was found
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_import_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("def f():\n    from pkg import two\n")
    (pkg / "two.py").write_text("from pkg.one import f\n")
    mods = modules(tmp_path, ("pkg",))
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert graph["pkg.one"] == {"pkg.two"} and graph["pkg.two"] == {"pkg.one"}
    assert cycles(graph) == [["pkg.one", "pkg.two"]]
