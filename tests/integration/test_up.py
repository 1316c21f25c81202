"""`manage.py up` (what `make run` starts) with the embedded defaults: SQLite, the
filesystem broker, in-memory channels and its own Ray head. The demo login works, a run
launched from the form goes through the Celery worker to Ray and succeeds, and SIGTERM
stops every process `up` started, Ray's included."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading

import httpx
import psutil
import pytest

from tests.integration.stack import REPO, child_env, free_web_port, short_home, wait_for

pytestmark = pytest.mark.slow

# Settings that would point `up` away from its embedded defaults.
PRODUCTION_SETTINGS = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "RAY_ADDRESS",
    "ROLLWAY_PUBLIC_URL",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
)
TINY = {
    "inference": {"backend": "torch"},
    # A policy that answers at all is enough here: the default 200 noisy steps of the
    # warm start would cost about 10 s of CPU before the first step.
    "warm_start": {"steps": 20, "noisy_steps": 0},
    "trainer": {"batch_groups": 4, "group_size": 4},
    "stop": {"max_steps": 3},
}
TERMINAL = {"succeeded", "failed", "cancelled"}


def csrf_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def post_form(client: httpx.Client, path: str, data: dict) -> httpx.Response:
    token = csrf_token(client.get(path).text)
    return client.post(
        path, data={**data, "csrfmiddlewaretoken": token}, headers={"Referer": f"{client.base_url}{path}"}
    )


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # exited meanwhile (Ray starts short-lived helpers)
        return []


def test_up_runs_the_product_on_embedded_defaults_and_sigterm_leaves_nothing():
    home = short_home()
    port = free_web_port()
    env = child_env(ROLLWAY_HOME=str(home))
    for name in PRODUCTION_SETTINGS:
        env.pop(name, None)
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(up.stdout), daemon=True).start()

    def output() -> str:
        return "".join(lines[-60:])

    try:
        wait_for(
            lambda: any("Rollway is up at" in line for line in lines) or up.poll() is not None,
            240,
            "`up` to print its URL",
        )
        assert up.poll() is None, output()
        banner = next(line for line in lines if "Rollway is up at" in line)
        assert f"http://127.0.0.1:{port}/" in banner and "demo / demo" in banner

        children = psutil.Process(up.pid).children(recursive=True)
        commands = [" ".join(cmdline(c)) for c in children]
        for expected in (
            "ray start --head",
            "rollway worker",
            "rollway beat",
            "rollway.asgi:application",
            "raylet",
            "gcs_server",
        ):
            # `up`'s own lines too: a child that died says why there ("ray exited (…)").
            assert any(expected in c for c in commands), f"no {expected!r} in {commands}\n{output()}"

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=True, timeout=30) as client:
            page = post_form(client, "/accounts/login/", {"username": "demo", "password": "demo"})
            assert "/accounts/login/" not in str(page.url), "the demo login was refused"

            form = client.get("/runs/new/").text
            experiment = re.search(r'<option value="(\d+)"[^>]*>[^<]*Async vs sync', form)
            assert experiment, "the demo experiment is not offered on the launch form"
            page = post_form(
                client,
                "/runs/new/",
                {
                    "experiment": experiment.group(1),
                    "preset": "async",
                    "name": "embedded",
                    "overrides": json.dumps(TINY),
                },
            )
            run_id = int(re.search(r"/runs/(\d+)/$", str(page.url)).group(1))
            run = wait_for(
                lambda: (r := client.get(f"/api/runs/{run_id}").json())["status"] in TERMINAL and r,
                300,
                f"run {run_id} to finish",
            )
            assert run["status"] == "succeeded", f"{run['status']}: {run['error']}\n{output()}"
            loss = client.get(f"/api/runs/{run_id}/metrics").json()["series"]["loss"]
            assert loss["steps"] == [1, 2, 3]

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=120) == 0, output()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left running after `up` stopped: {[p.pid for p in alive]}"
        for name in ("web", "beat", "worker"):
            assert any(f"{name} stopped (exit 0)" in line for line in lines), output()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        shutil.rmtree(home, ignore_errors=True)
