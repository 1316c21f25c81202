"""Rollway's Django settings, read from the environment (docs/configuration.md, "Settings").

Defaults make a bare checkout run on one machine with nothing installed: SQLite and the
Celery `filesystem://` broker under ROLLWAY_HOME, an in-memory channel layer, local Ray.
Production points DATABASE_URL, CELERY_BROKER_URL, REDIS_URL and RAY_ADDRESS at servers.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from foundation.env import env_bool, env_float, env_int, env_list, env_str
from foundation.production import production_key_error
from workers.core.logs import PLAIN as PLAIN_LOG
from workers.core.logs import log_format
from workers.run.admission import Limits
from workers.run.checkpoints import store_problem
from workers.run.reporter import INGEST_ENDPOINTS

REPO_ROOT = Path(__file__).resolve().parents[2]
FRONTEND_DIR = REPO_ROOT / "frontend"

ROLLWAY_HOME = Path(env_str("ROLLWAY_HOME", str(REPO_ROOT / "var"))).resolve()
ROLLWAY_HOME.mkdir(parents=True, exist_ok=True)
ROLLWAY_CACHE_DIR = str(ROLLWAY_HOME / "cache")
# What the engine posts metrics and status to; must be reachable from the Ray cluster.
ROLLWAY_PUBLIC_URL = env_str("ROLLWAY_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# None: workers.run.lifecycle uses RAY_ADDRESS from the environment, else starts/joins local Ray.
RAY_ADDRESS = env_str("RAY_ADDRESS")


def _persistent_secret_key(path: Path) -> str:
    """A random key created once under ROLLWAY_HOME, so a checkout is safe without
    configuration and web, worker and beat (started together) agree on one key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
    key = path.read_text().strip()
    if not key:  # another process created the file and is still writing it
        raise RuntimeError(f"{path} is empty; delete it or set DJANGO_SECRET_KEY")
    return key


DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
# A site that answers beyond loopback refuses to start without a key no one can guess
# (foundation/production.py); on loopback an unset key is made once under ROLLWAY_HOME.
if _key_error := production_key_error(env_str("DJANGO_SECRET_KEY"), ALLOWED_HOSTS):
    raise ImproperlyConfigured(_key_error)
SECRET_KEY = env_str("DJANGO_SECRET_KEY") or _persistent_secret_key(ROLLWAY_HOME / "secret_key")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves ASGI (HTTP + WebSocket)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",  # login rate limiting: failed attempts and lockouts, in the database
    "teams",
    "runs",
    "configs",
    "api",
    "ninja",  # the API docs page's template and its Swagger UI files (no CDN)
    "dashboard",
    "compare",  # the compare page and comparison experiments
    "ops",  # management commands only (up, …)
]

MIDDLEWARE = [
    # First: an oversized body is refused before anything reads it.
    "foundation.bodylimits.RequestBodyLimitMiddleware",
    # A NUL in a query parameter: a 400 here, not a database error in a view (the admin's).
    "foundation.nulguard.QueryNulMiddleware",
    # A view's database error (PostgreSQL down) → 503, JSON for the API, not an HTML 500.
    "foundation.dbdown.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "foundation.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After the session's user: a personal API token on /api/ replaces it (and skips CSRF).
    "api.token_auth.PersonalTokenMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a login the backend refused into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "rollway.urls"
ASGI_APPLICATION = "rollway.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [FRONTEND_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -----------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{ROLLWAY_HOME / 'rollway.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
# Under daphne every request runs its database work in a thread of its own, so a kept
# connection (DATABASE_CONN_MAX_AGE > 0) is never reused: each request leaves one open
# until garbage collection, and with 0 each request opens its own (a PostgreSQL backend
# forked per request). A pool (psycopg_pool, through Django's own support) hands
# connections across requests (docs/performance.md has the figures). On by default where
# psycopg[pool] is installed; DATABASE_POOL_SIZE=0 turns it off.
_POOLABLE = DATABASES["default"]["ENGINE"].endswith("postgresql")
DATABASE_POOL_SIZE = env_int("DATABASE_POOL_SIZE", 10 if importlib.util.find_spec("psycopg_pool") else 0)
if DATABASE_POOL_SIZE < 0:
    raise ImproperlyConfigured(f"DATABASE_POOL_SIZE must be 0 (no pool) or more (got {DATABASE_POOL_SIZE})")
if DATABASE_POOL_SIZE and _POOLABLE:
    if importlib.util.find_spec("psycopg_pool") is None:
        raise ImproperlyConfigured("DATABASE_POOL_SIZE needs psycopg_pool: pip install 'psycopg[pool]', or set it to 0")
    if DATABASES["default"]["CONN_MAX_AGE"]:
        raise ImproperlyConfigured("DATABASE_POOL_SIZE needs DATABASE_CONN_MAX_AGE=0 (the pool keeps the connections)")
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": DATABASE_POOL_SIZE,
        # How long a request waits for a free connection before it fails (a 503,
        # foundation/dbdown.py). While the database is down every request waits this long
        # (the pool keeps trying to reconnect): short, so callers hear 503 and back off;
        # long enough for a busy ingest (docs/performance.md).
        "timeout": 3,
    }
    # A pooled connection a database restart cut is replaced before a request gets it.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # web, worker and beat share one file. WAL lets readers and the one writer go on
    # together; IMMEDIATE makes a transaction take the write lock when it begins, so a
    # reader turning writer cannot deadlock with another writer (SQLite answers that
    # with "database is locked" at once, whatever the timeout); the timeout is how long
    # a writer waits its turn.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Migrations live in the top-level migrations/ package, one sub-package per app.
MIGRATION_MODULES = {app: f"migrations.{app}" for app in ("teams", "runs", "configs", "compare")}

# --- auth ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# AxesStandaloneBackend first: it refuses a locked-out username or address before the
# password is even checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:runs"
LOGOUT_REDIRECT_URL = "login"

# --- mail: only the password reset sends any (rollway/accounts.py) -------------------------
# Unset EMAIL_HOST: the site sends no mail and its password-reset pages say reset is off.
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
EMAIL_TIMEOUT = 10  # a mail server that does not answer must not hold a request for long
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", f"rollway@{EMAIL_HOST or 'localhost'}")

# --- i18n / time --------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- static files -------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = ROLLWAY_HOME / "static"  # collectstatic target (deploy images)
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every start without it
STATICFILES_DIRS = [FRONTEND_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "foundation.staticfiles.PlotlyFinder",  # plotly/plotly.min.js from the plotly package
]
# Serve straight from the finders: no collectstatic step before `up`.
WHITENOISE_USE_FINDERS = True


# --- request body limits (foundation/bodylimits.py) ----------------------------------------
# The engine's ingest (workers.run.reporter posts each report to one of these), as a pattern
# of request paths without their leading slash.
ROLLWAY_INGEST_PATHS = rf"^api/runs/\d+/({'|'.join(INGEST_ENDPOINTS)})$"


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise ImproperlyConfigured(f"{name} must be a positive number of bytes (got {value})")
    return value


# Every request but the engine's ingest: forms and the JSON API take a few KB at most.
ROLLWAY_MAX_BODY_BYTES = _positive("ROLLWAY_MAX_BODY_BYTES", env_int("ROLLWAY_MAX_BODY_BYTES", 1024 * 1024))
# POST to the engine's ingest (ROLLWAY_INGEST_PATHS): a batch of 10k+ points is ~1 MB of
# JSON and the ingest takes up to 50k points per request (~5 MB).
ROLLWAY_MAX_INGEST_BODY_BYTES = _positive(
    "ROLLWAY_MAX_INGEST_BODY_BYTES", env_int("ROLLWAY_MAX_INGEST_BODY_BYTES", 16 * 1024 * 1024)
)
# Django's own check, on every read of request.body/POST: the largest limit above, so it
# only backs up the middleware, which applies the limit that fits the endpoint.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(ROLLWAY_MAX_BODY_BYTES, ROLLWAY_MAX_INGEST_BODY_BYTES)
# The WebSockets are server → browser only: a client message is at most a ping.
ROLLWAY_MAX_WS_MESSAGE_BYTES = 4096

# --- channels -----------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    from redis.connection import parse_url

    from foundation.channel_layer import publish_retry

    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's pub/sub layer, which tells its consumers when Redis is
            # lost (foundation/channel_layer.py says why pub/sub, and why that).
            "BACKEND": "foundation.channel_layer.PubSubChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # Bounds on a Redis that neither answers nor refuses (a publish
                        # holds up the ingest request that sends it).
                        "socket_connect_timeout": 2,
                        "socket_timeout": 5,
                        **publish_retry(),
                    }
                ],
                # Pub/sub channels are server-wide, whatever the URL's database: sites
                # sharing a Redis server on different databases (the test suite and a
                # bench, staging and production) must not hear each other's runs.
                "prefix": f"rollway.db{parse_url(REDIS_URL).get('db', 0)}.",
            },
        }
    }
else:
    # Only reaches consumers in the same process: enough for one daphne, and for tests.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- celery (read by rollway/celery.py with namespace CELERY_) ------------------------
BROKER_DIR = ROLLWAY_HOME / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, with messages written whole (foundation/fs_broker.py).
    CELERY_BROKER_TRANSPORT = "foundation.fs_broker:Transport"
    # Producers (web) and consumers (worker) must share one folder for in and out.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "data_folder_processed": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "polling_interval": 0.05,  # ~50 ms dispatch; the default 1 s makes Launch feel slow
    }
    # The filesystem transport has no broadcast: no remote control, gossip or mingle.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = False  # tasks are short and idempotent; a redelivery is harmless
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# ray.init calls sys.stderr.fileno() (faulthandler), which Celery's logging proxy lacks.
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(ROLLWAY_HOME / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "reconcile-runs": {
        "task": "runs.tasks.reconcile_runs",
        "schedule": 15.0,
        "options": {"expires": 14.0},  # a backlog of reconciles is pointless
    },
}

# --- run lifecycle ------------------------------------------------------------------
# A run claimed by Celery gets this long to appear as a Ray actor before reconcile
# calls it lost (Ray start + actor creation on a loaded 2-core box take tens of seconds).
ROLLWAY_STARTING_GRACE_S = env_int("ROLLWAY_STARTING_GRACE_S", 180)
# A run's ingest token stops working this long after the run ended (api/ingest.py): long
# enough for its driver's last flush, and no token outlives its run.
ROLLWAY_INGEST_TOKEN_GRACE_S = env_int("ROLLWAY_INGEST_TOKEN_GRACE_S", 900)
if ROLLWAY_INGEST_TOKEN_GRACE_S < 0:
    raise ImproperlyConfigured(
        f"ROLLWAY_INGEST_TOKEN_GRACE_S must be 0 or more seconds (got {ROLLWAY_INGEST_TOKEN_GRACE_S})"
    )
# Points returned per series by the metrics API before downsampling kicks in.
ROLLWAY_MAX_POINTS_PER_SERIES = env_int("ROLLWAY_MAX_POINTS_PER_SERIES", 2000)
# The run queue (runs/queue.py): runs active at once on the site, and per team.
# Every run's config and series go to this MLflow tracking server (or store URI, e.g.
# file:///srv/mlruns) as they arrive (runs/tracking.py; needs the `mlflow` extra).
# Unset: nothing is exported.
ROLLWAY_MLFLOW_TRACKING_URI = env_str("ROLLWAY_MLFLOW_TRACKING_URI", "")
if ROLLWAY_MLFLOW_TRACKING_URI and importlib.util.find_spec("mlflow") is None:
    raise ImproperlyConfigured(
        "ROLLWAY_MLFLOW_TRACKING_URI is set but mlflow is not installed: pip install 'rollway[mlflow]' "
        "(or '.[mlflow]' in a checkout), or unset it"
    )
# Every run's series as TensorBoard scalars (and its config as text and hparams) under
# <this>/run-<id>/ (runs/sinks/tensorboard_sink.py; needs the `tensorboard` extra).
# Unset: nothing is written.
ROLLWAY_TENSORBOARD_DIR = env_str("ROLLWAY_TENSORBOARD_DIR", "")
if ROLLWAY_TENSORBOARD_DIR and importlib.util.find_spec("tensorboard") is None:
    raise ImproperlyConfigured(
        "ROLLWAY_TENSORBOARD_DIR is set but tensorboard is not installed: pip install 'rollway[tensorboard]' "
        "(or '.[tensorboard]' in a checkout), or unset it"
    )
# Every run to this Weights & Biases project (and entity: unset, the API key's default)
# (runs/sinks/wandb_sink.py; needs the `wandb` extra, and WANDB_API_KEY in the web and
# worker processes). Unset: nothing is sent.
ROLLWAY_WANDB_PROJECT = env_str("ROLLWAY_WANDB_PROJECT", "")
ROLLWAY_WANDB_ENTITY = env_str("ROLLWAY_WANDB_ENTITY", "")
if ROLLWAY_WANDB_PROJECT and importlib.util.find_spec("wandb") is None:
    raise ImproperlyConfigured(
        "ROLLWAY_WANDB_PROJECT is set but wandb is not installed: pip install 'rollway[wandb]' "
        "(or '.[wandb]' in a checkout), or unset it"
    )
ROLLWAY_MAX_RUNNING = env_int("ROLLWAY_MAX_RUNNING", 2)


# --- each team's share (teams/quotas.py): the site's defaults; a site admin sets a team's own
def _quota(name: str, default: int | None) -> int | None:
    """A quota: a whole number ≥ 0, or unset (None: no cap) where `default` is None."""
    if env_str(name) is None:
        return default
    value = env_int(name, 0)
    if value < 0:
        raise ImproperlyConfigured(f"{name} must be a whole number ≥ 0 (got {value}); unset it for no cap")
    return value


# Active runs (starting, running, cancelling, scheduled) one team may have at once.
ROLLWAY_MAX_RUNNING_PER_TEAM = _quota("ROLLWAY_MAX_RUNNING_PER_TEAM", 2)
# Runs one team may have waiting in the queue: a comparison's 100 runs fit.
ROLLWAY_TEAM_MAX_QUEUED = _quota("ROLLWAY_TEAM_MAX_QUEUED", 100)
# GPUs one team's active runs may hold together (unset: no cap but the cluster's).
ROLLWAY_TEAM_MAX_GPUS = _quota("ROLLWAY_TEAM_MAX_GPUS", None)
# The highest queue priority a member, and an admin, may give a run (runs/actions.py:
# from -10 to 10; priority orders a team's own runs, never one team's before another's).
ROLLWAY_MEMBER_MAX_PRIORITY = env_int("ROLLWAY_MEMBER_MAX_PRIORITY", 5)
ROLLWAY_ADMIN_MAX_PRIORITY = env_int("ROLLWAY_ADMIN_MAX_PRIORITY", 10)
for _name in ("ROLLWAY_MEMBER_MAX_PRIORITY", "ROLLWAY_ADMIN_MAX_PRIORITY"):
    if not -10 <= globals()[_name] <= 10:
        raise ImproperlyConfigured(f"{_name} must be from -10 to 10 (got {globals()[_name]})")

# --- confinement: the only places a run's config may name (workers/run/paths.py) ---------
# model.path must resolve (symlinks and .. followed) under one of these.
ROLLWAY_MODEL_ROOTS = env_list("ROLLWAY_MODEL_ROOTS", [str(ROLLWAY_HOME / "models")])
# task.dataset.path (and eval_path) likewise: by default the datasets shipped in the
# repository's data/ and examples/ and a data/ folder in ROLLWAY_HOME.
ROLLWAY_DATA_ROOTS = env_list(
    "ROLLWAY_DATA_ROOTS", [str(REPO_ROOT / "data"), str(REPO_ROOT / "examples"), str(ROLLWAY_HOME / "data")]
)
# The Hugging Face Hub owners (users, organisations) whose models, reward models and
# datasets a run may name (workers/core/hub.py); empty: any.
ROLLWAY_HUB_OWNERS = env_list("ROLLWAY_HUB_OWNERS", [])
# sync.directory likewise; empty (the default) means the field must stay unset and
# filesystem sync writes into the run's scratch directory.
ROLLWAY_SYNC_ROOTS = env_list("ROLLWAY_SYNC_ROOTS", [])
# Each run's scratch directory, run-<id>, is made here and removed when the run ends.
# Every Ray node and the Celery worker must see it (like the cache); a tmpfs keeps
# weight staging off disks.
ROLLWAY_SCRATCH_DIR = env_str("ROLLWAY_SCRATCH_DIR", str(ROLLWAY_HOME / "scratch"))
# Each successful run's exported model, run-<id>/, served by GET /api/runs/<id>/export.
ROLLWAY_EXPORT_DIR = env_str("ROLLWAY_EXPORT_DIR", str(ROLLWAY_HOME / "exports"))
# Each run's driver appends its log to run-<id>.log here, which the run's page and
# GET /api/runs/<id>/log serve (runs/logs.py): a directory the Ray nodes and the web
# process share, like the exports. Empty: runs keep no log of their own (Ray's only).
ROLLWAY_RUN_LOG_DIR = env_str("ROLLWAY_RUN_LOG_DIR", str(ROLLWAY_HOME / "logs"))
# Each run's checkpoints, run-<id>/step-<k>/ (workers/run/checkpoints.py): a directory every
# Ray node sees, or an fsspec URL (s3://bucket/prefix) on a cluster. A resumed run may
# start only from a checkpoint under it.
ROLLWAY_CHECKPOINT_ROOT = env_str("ROLLWAY_CHECKPOINT_ROOT", str(ROLLWAY_HOME / "checkpoints"))
if _store_problem := store_problem(ROLLWAY_CHECKPOINT_ROOT):
    raise ImproperlyConfigured(f"ROLLWAY_CHECKPOINT_ROOT: {_store_problem}")

# --- what one run may ask for (configs/policy.py): the engine's Limits, its defaults ---
ROLLWAY_MAX_STEPS = env_int("ROLLWAY_MAX_STEPS", Limits.max_steps)
ROLLWAY_MAX_MINUTES = env_float("ROLLWAY_MAX_MINUTES", Limits.max_minutes)
ROLLWAY_MAX_WORKERS = env_int("ROLLWAY_MAX_WORKERS", Limits.max_workers)
ROLLWAY_MAX_MODEL_PARAMS = env_int("ROLLWAY_MAX_MODEL_PARAMS", Limits.max_model_params)
# Memory of one GPU of the cluster, GiB, for the launch check of what each pool's GPU holds
# (workers.run.admission.gpu_demand). 0: from the GPU type Ray names (an "A100" counts 40).
ROLLWAY_GPU_MEMORY_GB = env_float("ROLLWAY_GPU_MEMORY_GB", 0.0)

# --- web security (docs/deployment.md, "Security") ------------------------------------
# Safe over plain HTTP too, so always on.
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"  # no page is meant to be framed (CSP frame-ancestors says the same)
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: every POST from a page is a form carrying
# {% csrf_token %}, and the pages' JS only GETs.
CSRF_COOKIE_HTTPONLY = True
# A refused CSRF check: JSON under /api/ (401 anonymous, 403 a session), Django's page elsewhere.
CSRF_FAILURE_VIEW = "foundation.security.csrf_failure"

# The TLS switches: off for `make run` on http://127.0.0.1, on behind a TLS proxy.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
# The run driver posts metrics to ROLLWAY_PUBLIC_URL, often the web service's plain-HTTP
# address inside the cluster, and probes ask /healthz over HTTP: a redirect breaks both.
SECURE_REDIRECT_EXEMPT = [ROLLWAY_INGEST_PATHS, r"^healthz$"]
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
if SECURE_HSTS_SECONDS < 0:
    raise ImproperlyConfigured(f"DJANGO_SECURE_HSTS_SECONDS must be 0 (off) or more (got {SECURE_HSTS_SECONDS})")
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# Only behind a proxy that sets X-Forwarded-Proto itself and that clients cannot bypass:
# otherwise a client could claim HTTPS.
if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Content-Security-Policy (django-csp; foundation/security.py adds ws:/wss: to this host).
# No inline script and no other origin anywhere. Inline styles are allowed: Plotly
# injects <style> elements (Chromium refuses them under style-src 'self' alone) and the
# run list sizes its progress bars with style attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],  # the empty favicon and Plotly's image export are data: URLs
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# Login rate limiting (django-axes): after ROLLWAY_LOGIN_FAILURE_LIMIT failed logins for
# one username, or from one client address, logins for it are refused (HTTP 429) for
# ROLLWAY_LOGIN_LOCKOUT_MINUTES; a successful login clears the count.
AXES_FAILURE_LIMIT = env_int("ROLLWAY_LOGIN_FAILURE_LIMIT", 5)
if AXES_FAILURE_LIMIT < 1:
    raise ImproperlyConfigured(f"ROLLWAY_LOGIN_FAILURE_LIMIT must be 1 or more (got {AXES_FAILURE_LIMIT})")
_LOCKOUT_MINUTES = env_int("ROLLWAY_LOGIN_LOCKOUT_MINUTES", 15)
if _LOCKOUT_MINUTES < 1:
    raise ImproperlyConfigured(f"ROLLWAY_LOGIN_LOCKOUT_MINUTES must be 1 or more (got {_LOCKOUT_MINUTES})")
AXES_COOLOFF_TIME = timedelta(minutes=_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own, not the pair
AXES_RESET_ON_SUCCESS = True
# Attempts made while locked out neither count nor extend the lockout: it ends when the
# page says, and a client hammering a locked login adds no rows.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "foundation.security.lockout_response"  # the login page with the reason
AXES_CLIENT_IP_CALLABLE = "foundation.security.client_ip"
AXES_DISABLE_ACCESS_LOG = True  # only failures are needed; a row per login grows forever
AXES_VERBOSE = False  # no banner from every process at start; logs name only what locks
# Proxies in front of daphne that append the client's address to X-Forwarded-For: 0 uses
# the connection's address (behind a proxy that is the proxy's, one address for all).
ROLLWAY_PROXY_COUNT = env_int("ROLLWAY_PROXY_COUNT", 0)
if ROLLWAY_PROXY_COUNT < 0:
    raise ImproperlyConfigured(f"ROLLWAY_PROXY_COUNT must be 0 or more (got {ROLLWAY_PROXY_COUNT})")

# --- logging ------------------------------------------------------------------------
# ROLLWAY_LOG_FORMAT=json: one JSON object a line, with the run's id on lines about a run
# (workers/core/logs.py; each run's driver reads the same variable).
try:
    ROLLWAY_LOG_FORMAT = log_format()
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": PLAIN_LOG}, "json": {"()": "workers.core.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": ROLLWAY_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("ROLLWAY_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
