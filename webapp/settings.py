"""Streamwise settings. Everything that differs between machines comes from the
environment: DATABASE_URL (default SQLite under var/), REDIS_URL, SPARK_MASTER_URL
("embedded" = the cluster `manage.py up` starts), SPARK_MASTER_WEB_URL, SPARK_DRIVER_HOST,
CHECKPOINT_ROOT, SECRET_KEY, DEBUG."""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import dj_database_url

from pipelines.runtime.host.secretfile import make_once

BASE_DIR = Path(__file__).resolve().parent.parent
# Every file a Streamwise process makes is its user's alone: the SQLite database,
# checkpoints, runner configs, logs (they name hosts and ports and may quote secrets).
# Set here, before any of them is made; the runners and Spark inherit it.
os.umask(0o077)
VAR_DIR = Path(os.environ.get("STREAMWISE_VAR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
VAR_DIR.chmod(0o700)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


DEBUG = env_bool("DEBUG", False)


def _installation_secret(path: Path) -> str:
    """This installation's own secret, made once and kept (mode 0600) under var/: every
    process of one installation (web, Celery, relay, runners) reads the same one, and
    no two installations share it (a public default key would let anyone forge
    sessions)."""
    return make_once(path, lambda: secrets.token_urlsafe(50))


SECRET_KEY = os.environ.get("SECRET_KEY") or _installation_secret(VAR_DIR / "secret_key")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "audit",
    "pipelines",
    "control",
    "accounts",
    "api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "audit.log.ActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]

ROOT_URLCONF = "webapp.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [BASE_DIR / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = None

DATABASES = {"default": dj_database_url.parse(
    os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"), conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat, relay) write: WAL + a busy timeout, and
    # IMMEDIATE transactions so writers queue instead of failing with "locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30, "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
    # Tests run real worker/relay processes against the test DB: it must be a file.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# The test suite only (tests/conftest.py sets it, for its own process and the live
# stack's): users' passwords hashed by a cheap hasher, as Django's testing docs advise.
# PBKDF2's 1,000,000 rounds took 0.35-0.5 s of CPU a user or a login, minutes of the
# suite. Never set it in a deployment.
if os.environ.get("STREAMWISE_TEST_CHEAP_PASSWORD_HASHER") == "1":
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet"
LOGOUT_REDIRECT_URL = "login"

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one user
# name from one address, that pair is locked out for AXES_COOLOFF_TIME hours (the
# login page answers 429); a successful login resets the count.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend",
                           "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = int(os.environ.get("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = float(os.environ.get("AXES_COOLOFF_HOURS", "0.25"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

# Cookies: never readable by scripts, not sent cross-site; outside DEBUG only over
# HTTPS — browsers count http://127.0.0.1 and localhost as secure, so `make run` on
# loopback keeps working; STREAMWISE_INSECURE_COOKIES=1 for plain http on another name.
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = (
    not DEBUG and not env_bool("STREAMWISE_INSECURE_COOKIES", False))
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# redis-py 8 defaults socket_timeout to 5 s, exactly channels_redis' BZPOPMIN block
# time: a consumer's read could time out as Redis answers and kill the WebSocket.
CHANNEL_LAYERS = {"default": {
    "BACKEND": "webapp.channel_layer.RedisChannelLayer",
    "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "prefix": "sw-asgi"},
}}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_TIME_LIMIT = 300
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Two queues, each with its own worker: the control plane's tasks (start, stop,
# reconfigure, control ticks, the reconciler) never wait behind Lab comparisons, which
# run for minutes and would otherwise fill every slot the control loop's ticks need.
CONTROL_QUEUE, LAB_QUEUE = "control", "lab"
CELERY_TASK_DEFAULT_QUEUE = CONTROL_QUEUE
CELERY_TASK_ROUTES = {"control.tasks.run_lab": {"queue": LAB_QUEUE},
                      # the exactly-once check reads a whole run back: minutes, one core
                      "pipelines.tasks.verify_run": {"queue": LAB_QUEUE}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task whose worker died unacknowledged is delivered again after the visibility timeout
# (it must outlive the longest task: a migration's acknowledgement wait); the sweep that
# finds such tasks runs every CELERY_UNACKED_RESTORE_INTERVAL_S.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": float(os.environ.get("CELERY_VISIBILITY_TIMEOUT_S", "3600")),
    "unacked_restore_interval": float(os.environ.get("CELERY_UNACKED_RESTORE_INTERVAL_S",
                                                     "10")),
    "unacked_restore_throttle": 1,
}
CELERY_BEAT_SCHEDULE = {
    # Retention (pipelines.retention): thin old metric samples, prune old runs' detail.
    "prune-old-data": {"task": "pipelines.tasks.prune_old_data", "schedule": 3600.0},
    # Every second: a dead runner is lost, and a stalled query stalled, within a pass.
    "reconcile-runs": {"task": "pipelines.tasks.reconcile_runs",
                       "schedule": float(os.environ.get("RECONCILE_EVERY_S", "1")),
                       "options": {"expires": 2.0}},
    # The closed loop: every second, one tick for each run whose control step is due
    # (control.ticks); a tick not started within 2 s is dropped, the next one comes.
    "control-tick": {"task": "control.tasks.control_tick_all", "schedule": 1.0,
                     "options": {"expires": 2.0}},
    # The plan watch (control.planwatch): COLA's plan proposed when a Python PE saturates.
    # A Lab comparison whose worker was killed under it is marked failed.
    "lab-stale": {"task": "control.tasks.fail_stale_labs", "schedule": 60.0,
                  "options": {"expires": 60.0}},
    "plan-watch": {"task": "control.tasks.watch_plans",
                   "schedule": float(os.environ.get("PLAN_WATCH_EVERY_S", "30")),
                   "options": {"expires": 30.0}},
}
# The Strategy Lab: a comparison longer than this is refused by the form (its cost is
# measured on a probe) or stopped and marked failed; under Celery's hard limit above.
LAB_TIME_LIMIT_S = float(os.environ.get("LAB_TIME_LIMIT_S", "240"))
# Comparisons one user may have queued or running at once (the Lab queue is shared with
# the exactly-once checks).
LAB_MAX_ACTIVE_PER_USER = int(os.environ.get("LAB_MAX_ACTIVE_PER_USER", "2"))
# Cores the embedded Spark worker offers (1-core executors); also what a policy may ask
# for when the master's JSON API does not answer (pipelines/cluster_status.py).
CLUSTER_CORES = int(os.environ.get("CLUSTER_CORES", "8"))
# One cluster, many runs (control/fleet.py): the arbiter that shares the cluster's cores
# between the runs' controllers ("priority" or "fcfs"), and the cluster-wide excluded
# periods, cron expressions separated by ";" (e.g. "* 2 * * *;50-59 * * * *"), added to
# every policy's own.
ARBITER = os.environ.get("ARBITER", "priority")
EXCLUDED_PERIODS = [p.strip() for p in os.environ.get("EXCLUDED_PERIODS", "").split(";")
                    if p.strip()]

# Alert webhooks (control/webhooks.py): public addresses only, except these hosts (an
# administrator's choice, e.g. an in-house alert receiver); bodies are signed with
# WEBHOOK_SECRET (default: derived from SECRET_KEY).
WEBHOOK_ALLOWED_HOSTS = [h.strip().lower() for h in
                         os.environ.get("WEBHOOK_ALLOWED_HOSTS", "").split(",") if h.strip()]
WEBHOOK_SECRET = os.environ.get("WEBHOOK_SECRET") or hashlib.sha256(
    f"streamwise-webhooks:{SECRET_KEY}".encode()).hexdigest()
WEBHOOK_DEADLINE_S = float(os.environ.get("WEBHOOK_DEADLINE_S", "10"))

SPARK_MASTER_URL = os.environ.get("SPARK_MASTER_URL", "embedded")
# Another cluster's master web UI (its JSON API lists workers, cores and memory: the
# Cluster page and the policy form's maximum workers); default http://MASTER-HOST:8080.
SPARK_MASTER_WEB_URL = os.environ.get("SPARK_MASTER_WEB_URL", "")
# The address executors on other hosts reach each run's driver at (and the driver binds
# to): loopback is right only while every worker runs on this machine.
SPARK_DRIVER_HOST = os.environ.get("SPARK_DRIVER_HOST", "127.0.0.1")
SPARK_DIR = Path(os.environ.get("SPARK_DIR", VAR_DIR / "spark"))
CHECKPOINT_ROOT = Path(os.environ.get("CHECKPOINT_ROOT", VAR_DIR / "checkpoints"))
EXECUTOR_MEMORY = os.environ.get("EXECUTOR_MEMORY", "512m")
# Warm standby runners kept ready on the embedded cluster (pipelines.runtime.runner.standby): a
# run that one fits starts its query at once instead of starting Spark. 0 turns them off.
STANDBY_RUNNERS = int(os.environ.get("STANDBY_RUNNERS", "1"))
# spark.cores.max of a standby's application: runs whose policy allows more workers
# start cold. The standby launches these executors once and keeps one.
STANDBY_MAX_WORKERS = int(os.environ.get("STANDBY_MAX_WORKERS", "4"))
STANDBY_ROOT = Path(os.environ.get("STANDBY_ROOT", VAR_DIR / "standby"))
# How many runs one standby serves one after another (a run that stopped cleanly hands
# the application back, reset). 1: every run gets an application no run used before.
STANDBY_RUNS = int(os.environ.get("STANDBY_RUNS", "1"))
# A new standby is started only when no run started within this many seconds.
STANDBY_QUIET_S = float(os.environ.get("STANDBY_QUIET_S", "30"))
# A run that has been "starting" this long without a heartbeat is lost.
RUNNER_START_GRACE_S = float(os.environ.get("RUNNER_START_GRACE_S", "30"))
# A reconfiguration's acknowledgement may take as long as the runner lets a migration run
# (pipelines.runtime.elastic.reconfigure.MIGRATION_TIMEOUT_S, 600 s) plus an executor's start: a
# shorter wait marked a slow scale-up failed while the runner went on to finish it.
COMMAND_ACK_TIMEOUT_S = float(os.environ.get("COMMAND_ACK_TIMEOUT_S", "720"))
# A run still pending this long has its start queued again (a queued task is lost when
# Redis restarts; starting is idempotent), and one pending this long has failed.
PENDING_REQUEUE_S = float(os.environ.get("PENDING_REQUEUE_S", "60"))
PENDING_GIVE_UP_S = float(os.environ.get("PENDING_GIVE_UP_S", "900"))
# Retention (pipelines.retention; the /retention/ page shows it): raw metric samples for
# this many days, then one per bucket; runner progress events and unapplied decisions,
# and kept output and checkpoints, this many days after their run ended.
RETAIN_RAW_SAMPLES_DAYS = float(os.environ.get("RETAIN_RAW_SAMPLES_DAYS", "7"))
RETAIN_SAMPLE_BUCKET_S = int(os.environ.get("RETAIN_SAMPLE_BUCKET_S", "60"))
RETAIN_DETAIL_DAYS = float(os.environ.get("RETAIN_DETAIL_DAYS", "30"))
RETAIN_FILES_DAYS = float(os.environ.get("RETAIN_FILES_DAYS", "7"))
# A runner still heartbeating this long after a stop request is hung in its stop: it
# gets SIGTERM, then SIGKILL (one micro-batch, the longest step of a stop, is far less).
STOP_TIMEOUT_S = float(os.environ.get("STOP_TIMEOUT_S", "120"))
# A running query with input waiting but no committed batch for STALL_FACTOR x its median
# batch time (at least two control steps, at least STALL_MIN_S) is stalled.
STALL_FACTOR = float(os.environ.get("STALL_FACTOR", "3"))
STALL_MIN_S = float(os.environ.get("STALL_MIN_S", "3"))

LOGGING = {
    "version": 1, "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

# /metrics (api/prometheus.py): a bearer token if set; otherwise only these networks.
STREAMWISE_METRICS_TOKEN = os.environ.get("STREAMWISE_METRICS_TOKEN", "")
STREAMWISE_METRICS_NETWORKS = [n.strip() for n in os.environ.get(
    "STREAMWISE_METRICS_NETWORKS", "127.0.0.0/8,::1/128").split(",") if n.strip()]
