"""`manage.py up` (what `make run` starts) with the embedded defaults: SQLite, the
filesystem broker, in-memory channels and its own Ray head. It serves the demo login,
and SIGTERM stops every process it started, Ray's included."""

from __future__ import annotations

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
PRODUCTION_SETTINGS = ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "RAY_ADDRESS",
                       "ROLLWAY_PUBLIC_URL", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def login(base_url: str, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=base_url, follow_redirects=True, timeout=30) as client:
        form = client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        return client.post(
            "/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base_url}/accounts/login/"},
        )


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # exited meanwhile (Ray starts short-lived helpers)
        return []


def test_up_serves_the_demo_login_and_sigterm_leaves_no_process_behind():
    home = short_home()
    port = free_web_port()
    env = child_env(ROLLWAY_HOME=str(home))
    for name in PRODUCTION_SETTINGS:
        env.pop(name, None)
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(up.stdout), daemon=True).start()
    try:
        wait_for(lambda: any("Rollway is up at" in l for l in lines) or up.poll() is not None,
                 240, "`up` to print its URL")
        assert up.poll() is None, "".join(lines[-40:])
        banner = next(l for l in lines if "Rollway is up at" in l)
        assert f"http://127.0.0.1:{port}/" in banner and "demo / demo" in banner

        children = psutil.Process(up.pid).children(recursive=True)
        commands = [" ".join(cmdline(c)) for c in children]
        for expected in ("ray start --head", "rollway worker", "rollway beat",
                         "rollway.asgi:application", "raylet", "gcs_server"):
            assert any(expected in c for c in commands), f"no {expected!r} in {commands}"

        page = login(f"http://127.0.0.1:{port}", "demo", "demo")
        assert page.status_code == 200
        assert "/accounts/login/" not in str(page.url), "the demo login was refused"

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=120) == 0, "".join(lines[-40:])
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left running after `up` stopped: {[p.pid for p in alive]}"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        shutil.rmtree(home, ignore_errors=True)
