"""`pip install rollway` is the command line alone: click, httpx, pyyaml and rich, never
torch, Ray or Django (the platform is the `platform` extra, which `cpu`, `gpu` and
`dev` include).

The first test reads the code: everything rollway_cli/ imports, following the project's
own modules it reaches (workers/core/merge.py), is the standard library or one of the base
dependencies. The slow one installs the project into a fresh virtual environment (no
system site-packages; pip fetches the four packages and their own dependencies from the
index or its cache) and runs the installed `rollway` against a small HTTP server.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI_DEPENDENCIES = {"click", "httpx", "pyyaml", "rich"}
# What the platform needs and the command line must never pull in.
PLATFORM_MODULES = ("torch", "ray", "django", "transformers", "celery", "vllm")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return norm(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def module_file(module: str) -> Path | None:
    """The repository's file for a first-party module, None for anything else."""
    parts = module.split(".")
    if parts[0] not in ("rollway_cli", "workers"):
        return None
    base = REPO.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, lazily inside functions included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{path}: relative import; the walk below reads absolute ones only")
            found.add(node.module)
            # `from workers import merge` imports the module workers.core.merge.
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names if module_file(f"{node.module}.{alias.name}")
            )
    return found


def cli_closure() -> tuple[set[Path], set[str]]:
    """(first-party files the command line loads, third-party top-level modules they import)."""
    todo = [REPO / "rollway_cli" / "__init__.py", *sorted((REPO / "rollway_cli").glob("*.py"))]
    seen: set[Path] = set()
    third_party: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imports_of(path):
            top = module.split(".")[0]
            own = module_file(module)
            if own is not None:
                todo.append(own)
                # A package's __init__ runs first when one of its modules is imported.
                parent = module_file(top)
                if parent is not None:
                    todo.append(parent)
            elif top in ("rollway_cli", "workers"):
                raise AssertionError(f"{path} imports {module}, which is not a file of the repository")
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return seen, third_party


def test_the_base_install_is_the_command_line_and_the_platform_an_extra():
    meta = project()
    assert {requirement_name(r) for r in meta["dependencies"]} == CLI_DEPENDENCIES
    assert meta["scripts"]["rollway"] == "rollway_cli.main:main"
    extras = meta["optional-dependencies"]
    platform = {requirement_name(r) for r in extras["platform"]}
    assert {"torch", "ray", "django", "transformers", "celery"} <= platform
    # Every flavour `make setup` and the image install, and dev, stand on the whole platform.
    for extra in ("cpu", "gpu", "dev"):
        assert "rollway[platform]" in extras[extra], f"the {extra} extra lacks rollway[platform]"


def test_the_command_line_imports_only_the_standard_library_and_its_four_packages():
    files, third_party = cli_closure()
    loaded = {p.relative_to(REPO).as_posix() for p in files}
    # The one engine module it reads (the `--set` grammar), its packages' __init__ files, and
    # the set-up the engine's package runs in a Ray worker (standard library only).
    engine = {
        "workers/__init__.py",
        "workers/core/__init__.py",
        "workers/core/merge.py",
        "workers/core/worker_process.py",
        "workers/core/import_memo.py",
    }
    assert engine <= loaded
    assert not {p for p in loaded if p.startswith("workers/")} - engine
    distributions = importlib.metadata.packages_distributions()
    for module in third_party:
        owners = {norm(d) for d in distributions.get(module, [module])}
        assert owners & CLI_DEPENDENCIES, f"rollway_cli imports {module} ({owners}), not a base dependency"


class StubSite(BaseHTTPRequestHandler):
    """Answers what the commands below ask of a site, and keeps each request."""

    requests: list[dict] = []

    def _answer(self, status: int, body: dict | str, content_type: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: bytes = b"") -> None:
        self.requests.append(
            {
                "method": self.command,
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "body": json.loads(body) if body else None,
            }
        )

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/api/runs?") or self.path == "/api/runs":
            run = {
                "id": 7,
                "name": "stub run",
                "status": "running",
                "team": {"id": 1, "name": "lab"},
                "preset": "async",
                "steps_done": 3,
                "latest_reward": 0.5,
                "samples_per_s": 12.0,
                "progress": 0.25,
                "duration_s": 61.0,
                "created_at": "2026-01-02T03:04:05Z",
            }
            self._answer(200, {"runs": [run], "page": 1, "pages": 1, "total": 1})
        elif self.path.startswith("/api/runs/7/log"):
            self._answer(200, {"run": 7, "size": 12, "offset": 0, "truncated": False, "text": "step 3 done\n"})
        else:
            self._answer(404, {"errors": {"run": "no such run"}})

    def do_POST(self) -> None:
        self._record(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self._answer(201, {"id": 8, "status": "queued", "name": "from the file", "url": "/runs/8/"})

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture()
def stub_site():
    StubSite.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubSite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", StubSite.requests
    server.shutdown()
    server.server_close()


# pip's words when it cannot reach the index at all (not when a package is missing there).
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


@pytest.mark.slow
def test_a_fresh_venv_gets_a_working_command_line_and_none_of_the_platform(tmp_path, stub_site):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, rollway = venv / "bin" / "python", venv / "bin" / "rollway"
    # Nothing of this test's own environment leaks in: no PYTHONPATH (the checkout and
    # platform/ are on it under pytest), and pip sees only the fresh venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env["ROLLWAY_CONFIG_DIR"] = str(tmp_path / "config")
    # A copy of the checkout, so the build's own files (build/, *.egg-info) stay out of it.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((REPO / name).read_bytes())
    for package in ("workers", "rollway_cli"):
        subprocess.run(["cp", "-r", str(REPO / package), str(source / package)], check=True)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if install.returncode != 0 and any(word in install.stderr for word in OFFLINE):
        pytest.skip(f"pip cannot reach its index from here: {install.stderr.strip().splitlines()[-1]}")
    assert install.returncode == 0, install.stderr
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, env=env).stdout
    installed = {norm(line.split("==")[0].split(" @ ")[0]) for line in frozen.splitlines() if line}
    assert CLI_DEPENDENCIES | {"rollway"} <= installed
    assert not installed & {"torch", "ray", "django", "transformers", "celery", "numpy"}, installed
    for module in PLATFORM_MODULES:
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, env=env)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, f"{module} imports in the CLI venv"

    helped = subprocess.run([str(rollway), "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0, helped.stderr
    for command in ("launch", "runs", "follow", "cancel", "compare", "export", "logs"):
        assert re.search(rf"^\s+{command}\s", helped.stdout, re.M), f"`rollway --help` lacks {command}"

    url, requests = stub_site
    site = [f"--url={url}", "--token=rwp_stub"]
    listed = subprocess.run([str(rollway), "runs", *site], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "stub run" in listed.stdout and "page 1/1 · 1 runs" in listed.stdout
    assert requests[-1]["path"] == "/api/runs" and requests[-1]["auth"] == "Bearer rwp_stub"

    # A launch file and --set: the YAML reader and the engine's `--set` grammar.
    (tmp_path / "run.yaml").write_text("preset: async\nname: from the file\nbuffer.capacity: 8\n")
    launched = subprocess.run(
        [str(rollway), "launch", str(tmp_path / "run.yaml"), "--set", "stop.max_steps=3", *site],
        capture_output=True,
        text=True,
        env=env,
    )
    assert launched.returncode == 0, launched.stderr
    assert launched.stdout.splitlines() == ["run 8 queued: from the file", f"{url}/runs/8/"]
    assert requests[-1]["method"] == "POST" and requests[-1]["body"] == {
        "preset": "async",
        "name": "from the file",
        "overrides": {"buffer": {"capacity": 8}, "stop": {"max_steps": 3}},
    }

    logged = subprocess.run([str(rollway), "logs", "7", *site], capture_output=True, text=True, env=env)
    assert logged.returncode == 0, logged.stderr
    assert logged.stdout == "step 3 done\n"

    missing = subprocess.run([str(rollway), "follow", "99", *site], capture_output=True, text=True, env=env)
    assert missing.returncode == 5, missing.stderr  # not found
