"""Web security: `check --deploy` is clean with the production switches (and those the
deploy files set), the headers every page carries (CSP without inline scripts or other
origins, framing, sniffing, referrer, cookies), the HTTPS redirect that spares the
engine's ingest, no inline script or handler in any template, and login rate limiting."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"

# What a deployment behind TLS turns on (docs/deployment.md, "Security").
TLS_SWITCHES = {
    "DJANGO_SECURE_SSL_REDIRECT": "true",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "true",
    "DJANGO_SESSION_COOKIE_SECURE": "true",
    "DJANGO_CSRF_COOKIE_SECURE": "true",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "DJANGO_SECURE_HSTS_PRELOAD": "true",
}


# --- manage.py check --deploy ---------------------------------------------------------------


def site_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """This process's environment without any Rollway/Django setting (so the embedded
    defaults apply, SQLite and all), plus `settings`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "ROLLWAY_", "DATABASE_", "REDIS_", "CELERY_", "RAY_"))
    }
    env.update(ROLLWAY_HOME=str(tmp_path / "home"), PYTHONPATH=os.pathsep.join([str(REPO / "platform"), str(REPO)]))
    env.update(settings)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def check_deploy(env: dict[str, str]) -> tuple[int, set[str], str]:
    """(exit code, the check ids reported, the output) of `check --deploy` that fails on
    any warning."""
    done = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    output = done.stdout + done.stderr
    return done.returncode, set(re.findall(r"\(([a-z_]+\.[A-Z]\d+)\)", output)), output


def production(**more: str) -> dict[str, str]:
    return {
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "rollway.example.com",
        **more,
    }


def test_check_deploy_is_clean_with_the_tls_switches_on(tmp_path):
    code, ids, output = check_deploy(site_env(tmp_path, **production(**TLS_SWITCHES)))
    assert code == 0 and not ids, output
    assert "System check identified no issues" in output


def test_check_deploy_warns_with_the_tls_switches_off(tmp_path):
    # The same production environment without the switches: what each of them fixes.
    code, ids, output = check_deploy(site_env(tmp_path, **production()))
    assert code != 0
    assert ids == {"security.W004", "security.W008", "security.W012", "security.W016"}, output


def interpolate(value: str) -> str:
    """A docker-compose value as compose fills it in when nothing is exported:
    ${NAME:-default} → default; ${NAME:?why} → a stand-in (compose would stop)."""
    value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
    return re.sub(r"\$\{\w+:\?[^}]*\}", "set-by-the-operator", value)


def deploy_envs() -> dict[str, dict[str, str]]:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text()) if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    return {
        "compose": {k: interpolate(v) for k, v in compose["services"]["web"]["environment"].items()},
        "k8s": {k: str(v) for k, v in config.items()},
    }


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_check_deploy_is_clean_with_what_the_deploy_files_set(tmp_path, where):
    env = deploy_envs()[where]
    assert {k: env.get(k) for k in TLS_SWITCHES} == TLS_SWITCHES
    # Only the site's own switches: services (database, broker, Ray) stay out of a check,
    # and the key is a real one instead of the files' placeholder.
    own = {k: v for k, v in env.items() if k.startswith("DJANGO_") or k == "ROLLWAY_PROXY_COUNT"}
    own["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    code, ids, output = check_deploy(site_env(tmp_path, **own))
    assert code == 0 and not ids, output


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("ROLLWAY_MAX_BODY_BYTES", "0", "ROLLWAY_MAX_BODY_BYTES must be a positive number of bytes (got 0)"),
        ("DJANGO_SECURE_HSTS_SECONDS", "-1", "DJANGO_SECURE_HSTS_SECONDS must be 0 (off) or more (got -1)"),
        ("ROLLWAY_LOGIN_FAILURE_LIMIT", "0", "ROLLWAY_LOGIN_FAILURE_LIMIT must be 1 or more (got 0)"),
        ("DJANGO_SECURE_SSL_REDIRECT", "yes please", "DJANGO_SECURE_SSL_REDIRECT must be one of"),
    ],
)
def test_a_bad_security_setting_is_an_error_naming_it(tmp_path, name, value, says):
    done = manage(site_env(tmp_path, **{name: value}), "check")
    assert done.returncode != 0
    assert says in done.stderr


# --- the secret key of a production site ------------------------------------------------------


@pytest.mark.parametrize(
    "key, says",
    [
        ("CHANGE-ME", 'looks like a placeholder (it contains "changeme")'),
        ("short-but-random-9f3k", "is 21 characters long, fewer than 50"),
        ("", "is unset"),
    ],
)
def test_a_site_beyond_loopback_refuses_a_guessable_secret_key(tmp_path, key, says):
    from foundation.production import MAKE_KEY

    env = site_env(tmp_path, DJANGO_ALLOWED_HOSTS="rollway.example.com", DJANGO_SECRET_KEY=key)
    done = manage(env, "check")
    assert done.returncode != 0
    assert f"DJANGO_SECRET_KEY {says}: a site that answers to rollway.example.com" in done.stderr
    assert MAKE_KEY in done.stderr


@pytest.mark.parametrize("key", ["", "rollway-integration-tests"])
def test_a_loopback_site_starts_with_its_embedded_or_a_short_key(tmp_path, key):
    done = manage(site_env(tmp_path, DJANGO_SECRET_KEY=key), "check")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "home" / "secret_key").exists() is (key == "")


@pytest.mark.parametrize(
    "key, fit",
    [
        (secrets.token_urlsafe(50), True),
        ("0123456789abcdef" * 4, True),  # `openssl rand -hex 32`'s shape
        ("ab" * 30, False),  # too few distinct characters
        ("django-insecure-" + secrets.token_urlsafe(50), False),  # Django's startproject key
        ("your-Secret-Key-" + secrets.token_urlsafe(50), False),
        (secrets.token_urlsafe(30), False),  # 40 characters
    ],
    ids=["token_urlsafe(50)", "hex", "ab-repeated", "django-insecure", "your-secret-key", "token_urlsafe(30)"],
)
def test_a_production_key_is_long_varied_and_no_placeholder(key, fit):
    from foundation.production import secret_key_problem

    assert (secret_key_problem(key) is None) is fit


def test_hosts_beyond_loopback_make_a_site_production():
    from foundation.production import beyond_loopback

    assert beyond_loopback(["127.0.0.1", "localhost", "[::1]", "127.0.0.2"]) == []
    assert beyond_loopback(["localhost", "*", ".example.com", "web"]) == ["*", ".example.com", "web"]


# --- headers on every page --------------------------------------------------------------------


def csp_directives(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in header.split(";")) if d}


@pytest.mark.parametrize("path", ["/accounts/login/", "/api/runs", "/healthz"])
def test_every_response_carries_the_csp_and_the_safe_headers(db, path):
    r = Client().get(path, HTTP_HOST="127.0.0.1:8000")
    policy = csp_directives(r)
    assert policy["script-src"] == ["'self'"]
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    # Nothing from another origin: keywords, data: images, and this host's WebSockets.
    own_sockets = {"ws://127.0.0.1:8000", "wss://127.0.0.1:8000"}
    for directive, sources in policy.items():
        for source in sources:
            allowed = source in {"'self'", "'none'"} or source in own_sockets and directive == "connect-src"
            allowed |= (directive, source) in {("style-src", "'unsafe-inline'"), ("img-src", "data:")}
            assert allowed, f"{directive} allows {source}"
    assert own_sockets <= set(policy["connect-src"])
    assert r["X-Frame-Options"] == "DENY"
    assert r["X-Content-Type-Options"] == "nosniff"
    assert r["Referrer-Policy"] == "same-origin"


def test_the_session_and_csrf_cookies_are_http_only(db):
    user = get_user_model().objects.create_user("hedy", password="pw-hedy-1")
    client = Client()
    page = client.get("/accounts/login/")
    assert page.cookies["csrftoken"]["httponly"]
    r = client.post("/accounts/login/", {"username": user.username, "password": "pw-hedy-1"})
    assert r.status_code == 302
    assert r.cookies["sessionid"]["httponly"]


def test_behind_tls_pages_redirect_but_the_ingest_and_healthz_do_not(db, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()  # built after the settings: SecurityMiddleware reads them once
    page = client.get("/accounts/login/")
    assert page.status_code == 301 and page["Location"] == "https://testserver/accounts/login/"
    # Through the TLS proxy (it says so in X-Forwarded-Proto) the page is served.
    assert client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https").status_code == 200
    # The engine posts over the cluster's plain HTTP; a redirect would lose its points.
    ingest = client.post("/api/runs/1/metrics", "{}", content_type="application/json")
    assert ingest.status_code == 401 and "ingest token" in ingest.json()["errors"]["auth"]
    assert client.post("/api/runs/1/status", "{}", content_type="application/json").status_code == 401
    assert client.get("/healthz").status_code == 200


# --- no inline script anywhere -----------------------------------------------------------------

TEMPLATE_DIRS = [REPO / "frontend" / "templates", *sorted((REPO / "platform").glob("*/templates"))]
INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
INLINE_HANDLER = re.compile(r"<[^>]*\son[a-z]+\s*=", re.I)
JS_URL = re.compile(r"""(?:href|src|action)\s*=\s*["']?\s*javascript:""", re.I)


def templates() -> list[Path]:
    found = [p for d in TEMPLATE_DIRS for p in d.rglob("*.html")]
    assert len(found) >= 10, TEMPLATE_DIRS  # guards the globs as much as the templates
    return found


def test_the_patterns_catch_what_the_csp_refuses():
    assert INLINE_SCRIPT.search("<script>go()</script>")
    assert INLINE_HANDLER.search('<form id="f" onsubmit="return false">')
    assert JS_URL.search('<a href="javascript:void(0)">')
    assert not INLINE_SCRIPT.search('<script src="/static/rollway/run.js"></script>')
    assert not INLINE_HANDLER.search('<input data-onchange="x" name="once">')


@pytest.mark.parametrize("path", templates(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_template_has_an_inline_script_or_handler(path):
    text = path.read_text()
    for pattern in (INLINE_SCRIPT, INLINE_HANDLER, JS_URL):
        found = pattern.search(text)
        assert not found, f"{path.relative_to(REPO)}: {found.group(0)!r} (move it into a static .js file)"


# --- login rate limiting ------------------------------------------------------------------------

PASSWORD = "pw-right-one"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def users(db):
    make = get_user_model().objects.create_user
    return make("ada", password=PASSWORD), make("bob", password=PASSWORD)


def log_in(username: str, password: str, ip: str):
    """One login through the login page from address `ip`; the response."""
    return Client().post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip)


def logged_in(response) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies


def test_the_limits_are_five_failures_and_fifteen_minutes_by_default(settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60


def test_five_failures_lock_the_username_even_with_the_right_password(users):
    # Each attempt from another address: it is the username that gets locked.
    for i in range(4):
        r = log_in("ada", "wrong", f"10.0.0.{i}")
        assert r.status_code == 200 and b"didn't match" in r.content
    fifth = log_in("ada", "wrong", "10.0.0.4")
    assert fifth.status_code == 429
    assert b"refused for 15 minutes" in fifth.content
    sixth = log_in("ada", PASSWORD, "10.0.0.5")
    assert sixth.status_code == 429 and not logged_in(sixth)
    assert b'id="login-locked"' in sixth.content


def test_another_user_is_unaffected(users):
    for i in range(5):
        log_in("ada", "wrong", f"10.0.1.{i}")
    assert log_in("ada", PASSWORD, "10.0.1.9").status_code == 429
    assert logged_in(log_in("bob", PASSWORD, "10.0.2.1"))


def test_five_failures_from_one_address_lock_that_address(users):
    for name in ("carl", "dora", "eve", "finn", "gus"):  # five usernames, one address
        log_in(name, "wrong", "10.0.3.1")
    assert log_in("bob", PASSWORD, "10.0.3.1").status_code == 429
    assert logged_in(log_in("bob", PASSWORD, "10.0.3.2"))


def test_the_lock_ends_after_the_window(users, settings):
    for _ in range(5):
        log_in("ada", "wrong", "10.0.4.1")
    assert log_in("ada", PASSWORD, "10.0.4.1").status_code == 429
    # The window passes by moving the recorded failures back past it, not by
    # waiting: a wait races a busy host, and this keeps the default 15 minutes.
    window = settings.AXES_COOLOFF_TIME
    AccessAttempt.objects.update(attempt_time=timezone.now() - window + timedelta(minutes=1))
    assert log_in("ada", PASSWORD, "10.0.4.1").status_code == 429  # a minute short of it
    AccessAttempt.objects.update(attempt_time=timezone.now() - window - timedelta(minutes=1))
    assert logged_in(log_in("ada", PASSWORD, "10.0.4.1"))


def test_a_success_resets_the_count(users):
    for _ in range(4):
        log_in("ada", "wrong", "10.0.5.1")
    assert logged_in(log_in("ada", PASSWORD, "10.0.5.1"))
    for _ in range(4):
        assert log_in("ada", "wrong", "10.0.5.1").status_code == 200
    assert logged_in(log_in("ada", PASSWORD, "10.0.5.1"))


def test_behind_proxies_the_address_is_the_one_the_outermost_proxy_saw(users, settings):
    settings.ROLLWAY_PROXY_COUNT = 1
    # Every request arrives from the proxy (one REMOTE_ADDR); a client cannot dodge the
    # lock by forging entries in front of what the proxy appended.
    for i in range(5):
        Client().post(
            "/accounts/login/",
            {"username": f"user{i}", "password": "wrong"},
            REMOTE_ADDR="10.9.9.9",
            HTTP_X_FORWARDED_FOR=f"1.2.3.{i}, 203.0.113.7",
        )
    locked = Client().post(
        "/accounts/login/",
        {"username": "bob", "password": PASSWORD},
        REMOTE_ADDR="10.9.9.9",
        HTTP_X_FORWARDED_FOR="203.0.113.7",
    )
    assert locked.status_code == 429
    other = Client().post(
        "/accounts/login/",
        {"username": "bob", "password": PASSWORD},
        REMOTE_ADDR="10.9.9.9",
        HTTP_X_FORWARDED_FOR="198.51.100.4",
    )
    assert logged_in(other)
