"""The pre-commit configuration: it parses, runs ruff (check and format) and mypy as local
hooks on the venv's binaries (nothing for pre-commit to download), and mypy's hook picks
exactly the files [tool.mypy] checks."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def hooks() -> dict[str, dict]:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    return {hook["id"]: hook for hook in config["repos"][0]["hooks"]}


def test_ruff_check_ruff_format_and_mypy_run_from_the_venv():
    found = hooks()
    assert set(found) == {"ruff-check", "ruff-format", "mypy"}
    for hook in found.values():
        assert hook["language"] == "system"
        binary = next(word for word in shlex.split(hook["entry"]) if word.startswith(".venv/bin/"))
        assert (REPO / binary).name in {"ruff", "python"}
    assert shlex.split(found["ruff-check"]["entry"])[1:3] == ["check", "--force-exclude"]
    assert shlex.split(found["ruff-format"]["entry"])[1:3] == ["format", "--force-exclude"]
    assert shlex.split(found["mypy"]["entry"])[-2:] == ["-m", "mypy"]


def test_mypys_hook_picks_the_files_tool_mypy_lists():
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    pattern = re.compile(hooks()["mypy"]["files"])
    sources = [
        p.relative_to(REPO).as_posix()
        for top in ("workers", "platform", "tests", "bench")
        for p in (REPO / top).rglob("*.py")
    ]
    for path in sources:
        checked = any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in listed)
        assert bool(pattern.search(path)) == checked, f"{path}: [tool.mypy] {'checks' if checked else 'skips'} it"
