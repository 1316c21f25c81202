"""platform/ is a source root, never a package (docs/architecture.md, "Layout").

A package named `platform` would shadow Python's stdlib module, which torch, Ray, Celery
and pytest all import. These tests check the stdlib module wins in every process kind
Rollway runs: pytest itself, `manage.py`, a Celery worker and a Ray worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def assert_stdlib_platform(platform_file: str) -> None:
    path = Path(platform_file).resolve()
    assert path == STDLIB / "platform.py", (
        f"`import platform` gave {path}, not the stdlib's {STDLIB / 'platform.py'}: "
        "something on sys.path shadows it (is there a platform/__init__.py?)"
    )


def source_root_env() -> dict[str, str]:
    """The environment `manage.py up` gives its children: both roots on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "platform"), str(REPO)])
    return env


def test_platform_folder_has_no_init_file():
    assert (REPO / "platform").is_dir()
    assert not (REPO / "platform" / "__init__.py").exists(), (
        "platform/__init__.py exists: delete it; platform/ must stay a plain source root"
    )


def test_pytest_imports_stdlib_platform_with_the_source_root_on_sys_path():
    import platform

    # The test is only meaningful if the folder named platform is reachable on sys.path.
    assert any(Path(p).resolve() == REPO for p in sys.path if p)
    assert_stdlib_platform(platform.__file__)
    assert platform.python_version().startswith("3.")


def test_manage_py_shell_imports_stdlib_platform():
    code = "import platform, rollway; print(platform.__file__)"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=source_root_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert_stdlib_platform(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_celery_worker_imports_stdlib_platform(tmp_path):
    """A real `celery -A rollway worker` runs ops.tasks.probe_environment from its queue."""
    from ops.tasks import probe_environment

    queue = f"layout-{uuid.uuid4().hex[:8]}"  # private queue: never steals real tasks
    report = tmp_path / "report.json"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "rollway",
            "worker",
            "--pool",
            "solo",
            "-Q",
            queue,
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ],
        cwd=REPO,
        env=source_root_env(),
        start_new_session=True,
    )
    try:
        probe_environment.apply_async(args=[str(report)], queue=queue)
        deadline = time.monotonic() + 90
        while not report.exists() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
        assert report.exists(), f"the worker (exit {worker.poll()}) never ran the probe"
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    data = json.loads(report.read_text())
    assert data["pid"] != os.getpid()
    assert_stdlib_platform(data["platform_file"])
    assert Path(data["workers_file"]).resolve() == REPO / "workers" / "__init__.py"


@pytest.mark.slow
def test_ray_worker_imports_stdlib_platform():
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace=f"layout-{uuid.uuid4().hex[:8]}",
        runtime_env={"env_vars": {"PYTHONPATH": source_root_env()["PYTHONPATH"]}},
    )
    try:

        @ray.remote(num_cpus=0)
        def where_is_platform():
            import os
            import platform

            return os.getpid(), platform.__file__, platform.python_version()

        pid, platform_file, version = ray.get(where_is_platform.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert pid != os.getpid()  # it really ran in a Ray worker process
    assert_stdlib_platform(platform_file)
    assert version == sys.version.split()[0]


def test_test_files_have_unique_basenames():
    """The test folders are not packages, so pytest imports each test file as a top-level
    module named by its basename: two files of one name stop collection of the whole suite."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(REPO)} and {path.relative_to(REPO)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files share a basename (rename one): " + "; ".join(clashes)
