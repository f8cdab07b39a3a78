"""Django settings, all from environment variables with development defaults (see README, "Configuration")."""

from __future__ import annotations

import os
from pathlib import Path

from celery.schedules import crontab  # noqa: F401  (kept for beat schedules added by later apps)
from csp.constants import NONE as CSP_NONE
from csp.constants import SELF as CSP_SELF

from portal.env import (
    ConfigurationError,
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_networks,
    env_str,
    oidc_providers,
    origin_of,
    secret_key,
)
from portal.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

# Production unless told otherwise: no debug pages, a secret key of this installation's own (README,
# "Configuration"); `PORTAL_DEBUG=true` is for development on one's own machine.
DEBUG = env_bool("PORTAL_DEBUG", False)
SECRET_KEY = secret_key(debug=DEBUG, generated=BASE_DIR / "var" / "secret_key")
ALLOWED_HOSTS = env_list("PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("PORTAL_CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"])

# Served over HTTPS (README, "Operations"): cookies only travel over TLS, browsers are told to keep to HTTPS
# (HSTS) and plain HTTP is redirected, except the health check that load balancers ask over HTTP. On by default
# without debug; the demo serves plain HTTP on loopback and turns it off (PORTAL_HTTPS=false, Makefile).
PORTAL_HTTPS = env_bool("PORTAL_HTTPS", not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = PORTAL_HTTPS
# Django's database sessions, read by a prepared statement (portal/sessions.py).
SESSION_ENGINE = "portal.sessions"
SECURE_SSL_REDIRECT = PORTAL_HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("PORTAL_HSTS_SECONDS", 365 * 24 * 3600 if PORTAL_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PORTAL_HSTS_INCLUDE_SUBDOMAINS", True)
# Asking browsers to preload the domain is the site's own decision about its whole domain: opt in.
SECURE_HSTS_PRELOAD = env_bool("PORTAL_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
# Behind PORTAL_NUM_PROXIES trusted proxies (nginx in scripts/portal.sh), the request was HTTPS when the proxy
# says so; nginx sets X-Forwarded-Proto itself, so a client cannot.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_int("PORTAL_NUM_PROXIES", 0) else None

# Prometheus metrics at /metrics (README, "Metrics and alerts"): recorded by every process (in multiprocess mode
# when PROMETHEUS_MULTIPROC_DIR is set, as scripts/portal.sh sets it), read by scrapers from PORTAL_METRICS_ALLOW
# (loopback by default; behind the proxy the address is the one it saw, PORTAL_NUM_PROXIES) that carry
# PORTAL_METRICS_TOKEN when one is set. PORTAL_METRICS=false records nothing, to measure what recording costs.
PORTAL_METRICS = env_bool("PORTAL_METRICS", True)
PORTAL_METRICS_TOKEN = env_str("PORTAL_METRICS_TOKEN", "")
PORTAL_METRICS_ALLOW = env_networks("PORTAL_METRICS_ALLOW", ["127.0.0.1/32", "::1/128"])
# Made if missing: a directory on a tmpfs (/run/gpuportal/metrics) is gone after a reboot, and every metric write
# (so every request) would fail without it.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
if PORTAL_METRICS and not PORTAL_METRICS_ALLOW and not PORTAL_METRICS_TOKEN:
    raise ConfigurationError(
        "PORTAL_METRICS_ALLOW is empty (any address) and PORTAL_METRICS_TOKEN is not set: anyone could read /metrics. "
        "Set a token (or PORTAL_METRICS_TOKEN_FILE), or list the scrapers' networks."
    )

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "csp",
    "tenants",
    "clusters",
    "quotas",
    "jobs",
    "billing",
    "frontend",
    # Single sign-on (README, "Single sign-on"); after frontend, whose templates replace allauth's.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    # Two-factor sign-in (TOTP) for local accounts: frontend/two_factor_views.py, tenants/two_factor.py.
    "allauth.mfa",
]

# Overload (portal/overload.py): a request that waited in line (behind the proxy, which stamps X-Request-Start)
# longer than this is answered 503 before any work (0: never); 503s say to come back after PORTAL_RETRY_AFTER_SECONDS.
PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS = float(env_str("PORTAL_REQUEST_QUEUE_TIMEOUT_SECONDS", "10"))
PORTAL_RETRY_AFTER_SECONDS = env_int("PORTAL_RETRY_AFTER_SECONDS", 5)

MIDDLEWARE = [
    # Outermost, so that it times and counts every answer, the other middleware's refusals included.
    *(["portal.metrics.http_metrics_middleware"] if PORTAL_METRICS else []),
    # Next, so that every line logged for a request, and every answer, carries its id (portal/request_ids.py).
    "portal.request_ids.request_id_middleware",
    "django.middleware.security.SecurityMiddleware",
    # Before anything reads the database: a request that waited too long in line is answered 503 at once.
    "portal.overload.overload_shed",
    "portal.request_guard.nul_characters_refused",
    # Outside CommonMiddleware: APPEND_SLASH redirects first, then an unknown /api/ path gets the JSON shape.
    "portal.api_errors.api_not_found_as_json",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: the person's profile zone, else their browser's, else UTC (frontend/time_zones.py).
    "frontend.time_zones.time_zone_activate",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "frontend.two_factor_views.two_factor_gate",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context_processors.navigation",
                "frontend.time_zones.time_zone_context",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# portal/cache.py: Django's Redis cache without a new redis-py client for every operation.
CACHES = {"default": {"BACKEND": "portal.cache.SharedClientRedisCache", "LOCATION": REDIS_URL}}

# channels_redis blocks up to 5 s reading a group's messages; redis-py's default socket timeout is also 5 s,
# so on a busy machine the read times out and kills the consumer. A longer socket timeout keeps them apart.
CHANNELS_REDIS_SOCKET_TIMEOUT_SECONDS = 30
# Redis connections one server process may open for the channel layer. Every WebSocket handshake joins its
# groups over connections of its own, at once; redis-py 8 caps a pool at 100 by default and refuses the next
# one, so 100 viewers opening a job's log together got HTTP 500s (bench/log_latency.py). Connections a burst
# opened stay in the pool for the next.
CHANNELS_REDIS_MAX_CONNECTIONS = env_int("CHANNELS_REDIS_MAX_CONNECTIONS", 2000)


def channel_layer_host(url: str) -> dict[str, object]:
    return {
        "address": url,
        "socket_timeout": CHANNELS_REDIS_SOCKET_TIMEOUT_SECONDS,
        "max_connections": CHANNELS_REDIS_MAX_CONNECTIONS,
    }


CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [channel_layer_host(env_str("CHANNELS_REDIS_URL", REDIS_URL))]},
    }
}

# Celery: the broker carries only task messages; the database stays the source of truth.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# A worker process keeps its PostgreSQL connection from task to task for this long (portal/celery.py), as a
# WSGI worker keeps its own: Celery's default, a new connection for every task, cost the worker and PostgreSQL
# more CPU than the job delivery it was opened for. 0 restores Celery's default.
CELERY_WORKER_DATABASE_CONN_MAX_AGE = env_int("CELERY_WORKER_DATABASE_CONN_MAX_AGE", 600)
# Celery's Django fixup closes every connection before and after each task unless told to keep them for this
# many tasks; the worker's own handlers (portal/celery.py) close them when broken or too old instead.
CELERY_DB_REUSE_MAX = 1_000_000 if CELERY_WORKER_DATABASE_CONN_MAX_AGE else None
# How often each cluster is asked for job changes (one listing with update_time per cluster): every
# JOB_SYNC_ACTIVE_SECONDS while it has queued, pending or running jobs, else every JOB_SYNC_INTERVAL_SECONDS
# (also the pace of usage collection from accounting); see jobs/sync_schedule.py.
JOB_SYNC_INTERVAL_SECONDS = env_int("JOB_SYNC_INTERVAL_SECONDS", 5)
JOB_SYNC_ACTIVE_SECONDS = float(env_str("JOB_SYNC_ACTIVE_SECONDS", "1"))
JOB_SYNC_SLOT_SECONDS = 120  # a sync slot held by a worker that died is free again after this
# While portal jobs wait, every job is listed at most this often, to refresh Slurm's expected start times (its
# backfill moves them without marking the jobs changed, so the listing of changes misses them).
JOB_START_ESTIMATE_REFRESH_SECONDS = env_int("JOB_START_ESTIMATE_REFRESH_SECONDS", 15)
# How often beat checks that the database is still its own (not a restored copy) and searches Slurm for the
# jobs a restore lost while a recovery is open; see jobs/database_restores.py.
RESTORE_CHECK_INTERVAL_SECONDS = env_int("RESTORE_CHECK_INTERVAL_SECONDS", 30)
# How often each cluster's GPU utilisation is read from its Prometheus (jobs/gpu_utilisation.py): two queries per
# cluster and cycle; each reading is averaged over this interval. An idle job is flagged at most this long late.
GPU_UTILISATION_INTERVAL_SECONDS = env_int("GPU_UTILISATION_INTERVAL_SECONDS", 30)
CELERY_BEAT_SCHEDULE = {
    "sync-all-clusters": {
        "task": "clusters.tasks.cluster_sync_all",
        "schedule": env_int("CLUSTER_SYNC_INTERVAL_SECONDS", 30),
    },
    "sync-all-jobs": {
        "task": "jobs.tasks.jobs_sync_all",
        "schedule": JOB_SYNC_ACTIVE_SECONDS,
        "options": {"expires": JOB_SYNC_ACTIVE_SECONDS},  # a tick that waited is replaced by the next
    },
    "sync-quota-limits": {
        "task": "quotas.tasks.quota_limits_sync_all",
        "schedule": env_int("QUOTA_LIMIT_SYNC_INTERVAL_SECONDS", 60),
    },
    "reconcile-slurm-accounts": {
        "task": "clusters.tasks.slurm_reconcile_all",
        "schedule": env_int("SLURM_RECONCILE_INTERVAL_SECONDS", 600),
    },
    "import-usage": {
        "task": "billing.tasks.usage_import",
        "schedule": env_int("BILLING_IMPORT_INTERVAL_SECONDS", 30),
    },
    "watch-for-restores": {
        "task": "jobs.tasks.database_restore_watch",
        "schedule": RESTORE_CHECK_INTERVAL_SECONDS,
    },
    "collect-gpu-utilisation": {
        "task": "jobs.tasks.gpu_utilisation_collect_all",
        "schedule": GPU_UTILISATION_INTERVAL_SECONDS,
        "options": {"expires": GPU_UTILISATION_INTERVAL_SECONDS},
    },
    # The efficiency report reads ended jobs from their month's sums and sums the others live: the fewer those,
    # the cheaper the dashboard (billing/efficiency.py).
    "sum-job-efficiency": {
        "task": "billing.tasks.efficiency_sums_add",
        "schedule": env_int("EFFICIENCY_SUMS_INTERVAL_SECONDS", 600),
        "options": {"expires": 600},
    },
    "finalise-invoices": {
        "task": "billing.tasks.invoices_finalise_due",
        "schedule": 3600,
    },
    "archive-job-history": {
        "task": "jobs.tasks.job_history_archive",
        "schedule": env_int("JOB_HISTORY_ARCHIVE_INTERVAL_SECONDS", 3600),
        "options": {"expires": 600},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Local passwords stored with Argon2id (portal/hashers.py); PBKDF2, Django's default, still checks older hashes,
# which are stored again with Argon2id at the person's next sign-in.
PASSWORD_HASHERS = [
    "portal.hashers.Argon2idPasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]
# The OWASP Password Storage Cheat Sheet's minimum for Argon2id; neither may be set below it.
ARGON2_MIN_MEMORY_KIB, ARGON2_MIN_TIME_COST = 19456, 2
PORTAL_ARGON2_MEMORY_KIB = env_int("PORTAL_ARGON2_MEMORY_KIB", ARGON2_MIN_MEMORY_KIB)
PORTAL_ARGON2_TIME_COST = env_int("PORTAL_ARGON2_TIME_COST", ARGON2_MIN_TIME_COST)
if PORTAL_ARGON2_MEMORY_KIB < ARGON2_MIN_MEMORY_KIB or PORTAL_ARGON2_TIME_COST < ARGON2_MIN_TIME_COST:
    raise ConfigurationError(
        f"PORTAL_ARGON2_MEMORY_KIB ({PORTAL_ARGON2_MEMORY_KIB}) and PORTAL_ARGON2_TIME_COST "
        f"({PORTAL_ARGON2_TIME_COST}) may not be set below {ARGON2_MIN_MEMORY_KIB} and {ARGON2_MIN_TIME_COST}: "
        "weaker would store passwords below the OWASP minimum. Unset them for that minimum, or raise them."
    )

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Dates and times that templates write without a format of their own: 24-hour, with the zone (portal/formats/).
FORMAT_MODULE_PATH = ["portal.formats"]

# Signing in: local passwords (the login form, POST /api/v1/tokens/ and the Django admin's form, all through
# tenants.backends) unless PORTAL_LOCAL_PASSWORDS is false, and the OpenID providers of PORTAL_OIDC_PROVIDERS
# through django-allauth (tenants/oidc.py): code flow with PKCE, state, nonce, ID tokens checked against the
# provider's keys, accounts made at the first sign-in. README, "Single sign-on".
PORTAL_LOCAL_PASSWORDS = env_bool("PORTAL_LOCAL_PASSWORDS", True)
OIDC_PROVIDERS = oidc_providers(env_str("PORTAL_OIDC_PROVIDERS", "[]"))
AUTHENTICATION_BACKENDS = ["tenants.backends.LocalPasswordBackend"]
SOCIALACCOUNT_PROVIDERS = {
    "openid_connect": {
        # The portal's provider class: it sends and checks a nonce and always checks the ID token's signature.
        "provider_class": "tenants.oidc.PortalOpenIDConnectProvider",
        "OAUTH_PKCE_ENABLED": True,
        "APPS": OIDC_PROVIDERS,
    }
}
SOCIALACCOUNT_ADAPTER = "tenants.oidc.SignInAdapter"
ACCOUNT_ADAPTER = "tenants.oidc.NoSelfSignupAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_LOGIN_ON_GET = False  # a sign-in starts from a form post (CSRF-checked), not from any link
SOCIALACCOUNT_STORE_TOKENS = False
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_UNIQUE_EMAIL = False  # people share addresses (lab mailing lists); usernames identify them
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "email", "password1*"]
# Two-factor sign-in after a portal password: an authenticator app's codes (TOTP), optional for everyone;
# PORTAL_MFA_REQUIRED_FOR_STAFF=true makes staff set it up before they can use the portal after a password.
PORTAL_MFA_REQUIRED_FOR_STAFF = env_bool("PORTAL_MFA_REQUIRED_FOR_STAFF", False)
MFA_SUPPORTED_TYPES = ["totp"]
MFA_TOTP_ISSUER = "GPU portal"
MFA_TOTP_TOLERANCE = 1  # one 30-second period either side: phones' clocks drift

STATIC_URL = "static/"
# The portal's own pages load scripts, styles and images from the portal only: no inline script or style,
# no eval, no CDN; live updates connect back to the same origin (its WebSockets included). The Django admin
# and the Swagger UI are third-party pages with inline code of their own, so they are left out.
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/admin/", "/api/docs/"],
    "DIRECTIVES": {
        "default-src": [CSP_SELF],
        "script-src": [CSP_SELF],
        "style-src": [CSP_SELF],
        "img-src": [CSP_SELF, "data:"],
        "font-src": [CSP_SELF],
        "connect-src": [CSP_SELF],
        "object-src": [CSP_NONE],
        "base-uri": [CSP_SELF],
        # Signing in and out through an OpenID provider is a form posted here and redirected there.
        "form-action": [CSP_SELF, *sorted({origin_of(app["settings"]["server_url"]) for app in OIDC_PROVIDERS})],
        "frame-ancestors": [CSP_NONE],
    },
}
STATIC_ROOT = BASE_DIR / "var" / "static"
# Serve static files straight from the apps (no collectstatic step); turn off after `collectstatic` in production.
WHITENOISE_USE_FINDERS = env_bool("PORTAL_STATIC_USE_FINDERS", True)

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "portal.api_pagination.PagePagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api_errors.api_exception_handler",
    # Guessing limits per client address (tenants/throttles.py): password attempts at the login form and
    # POST /api/v1/tokens/ together, and requests with unknown, expired or revoked bearer tokens.
    "DEFAULT_THROTTLE_RATES": {
        "login": env_str("API_LOGIN_THROTTLE_RATE", "30/min"),
        "token_guess": env_str("API_TOKEN_GUESS_THROTTLE_RATE", "30/min"),
    },
    # Throttles key on the client address. With 0, X-Forwarded-For is ignored (a client could forge it);
    # behind N trusted reverse proxies set PORTAL_NUM_PROXIES=N.
    "NUM_PROXIES": env_int("PORTAL_NUM_PROXIES", 0),
}
# Wrong passwords one username may have from one address in an hour before each further try must wait
# (30 s, doubling up to 15 min; tenants/throttles.py).
LOGIN_ACCOUNT_FREE_FAILURES = env_int("API_LOGIN_ACCOUNT_FREE_FAILURES", 5)

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU portal API",
    "DESCRIPTION": (
        "Tenants, projects, members, tokens, the audit log, clusters, jobs, their logs and templates, GPU-hour "
        "quotas, prices, invoices, estimates, spend and reconciliation of the GPU cluster portal. "
        "Authenticate with a session (browser) or `Authorization: Bearer <token>`. "
        "Every error has the shape `{code, message, fields}`."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api_errors.schema_errors_everywhere",
        "portal.api_inputs.bodies_closed_in_schema",
    ],
    # Several models have a field named "state"; each choice set gets its own name in the schema.
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.models.JobState",
        "SlurmAccountStateEnum": "clusters.models.ProjectSlurmAccount.State",
        "QuotaRequestStateEnum": "quotas.models.QuotaRequestState",
        "InvoiceStateEnum": "billing.models.InvoiceState",
        "ReconciliationStateEnum": "billing.models.ReconciliationState",
    },
}

# Slurm: how long tokens minted for slurmrestd live, and the HTTP client's limits.
SLURM_TOKEN_LIFESPAN_SECONDS = env_int("SLURM_TOKEN_LIFESPAN_SECONDS", 300)
SLURM_HTTP_TIMEOUT_SECONDS = float(env_str("SLURM_HTTP_TIMEOUT_SECONDS", "10"))
SLURM_HTTP_MAX_CONNECTIONS = env_int("SLURM_HTTP_MAX_CONNECTIONS", 10)

# Jobs: limits on what a submission may carry, and how the workers deliver and follow jobs.
JOB_SCRIPT_MAX_BYTES = env_int("JOB_SCRIPT_MAX_BYTES", 256 * 1024)
JOB_ENVIRONMENT_MAX_BYTES = env_int("JOB_ENVIRONMENT_MAX_BYTES", 64 * 1024)
# Job arrays: every task index must be below this (Slurm's MaxArraySize, 1001 by default: indexes 0-1000).
JOB_ARRAY_MAX_SIZE = env_int("JOB_ARRAY_MAX_SIZE", 1001)
# How long one worker holds a job while submitting it; after that another may take over (and looks first).
JOB_SUBMIT_LEASE_SECONDS = env_int("JOB_SUBMIT_LEASE_SECONDS", 60)
# A queued job whose retry is this overdue (its message lost with Redis or a killed worker) is requeued.
JOB_SUBMIT_SWEEP_GRACE_SECONDS = env_int("JOB_SUBMIT_SWEEP_GRACE_SECONDS", 30)
# Retries back off from 5 s to this cap; after JOB_SUBMIT_GIVE_UP_HOURS in the queue a job is rejected.
JOB_SUBMIT_RETRY_MAX_SECONDS = env_int("JOB_SUBMIT_RETRY_MAX_SECONDS", 300)
JOB_SUBMIT_GIVE_UP_HOURS = env_int("JOB_SUBMIT_GIVE_UP_HOURS", 24)
# A worker delivers a cluster's due queued jobs in batches of this many (claimed in one transaction, recorded in
# another), submitting up to JOB_DELIVERY_THREADS of a batch at once over the cluster's one keep-alive client
# (at most SLURM_HTTP_MAX_CONNECTIONS); it stops claiming batches after JOB_DELIVERY_RUN_SECONDS, so a run ends
# well inside its task's time limit and within the lease of the batch it is on.
JOB_DELIVERY_BATCH_SIZE = env_int("JOB_DELIVERY_BATCH_SIZE", 50)
JOB_DELIVERY_THREADS = env_int("JOB_DELIVERY_THREADS", 4)
JOB_DELIVERY_RUN_SECONDS = env_int("JOB_DELIVERY_RUN_SECONDS", 20)
# Under a stream of single submissions a run's claims find a job or two each, and every batch costs the worker
# and PostgreSQL the same few transactions: while its run holds the cluster's wake, after a batch smaller than
# JOB_DELIVERY_BATCH_SIZE the next claim comes this long after that batch's claim (at once if the batch took
# longer), so it carries the jobs accepted meanwhile. A job waits at most this much longer for its claim. 0 (the
# default) claims again at once: on a 2-core machine a batch under load takes longer than 25-50 ms, so the linger
# rarely bit, and quiet runs showed no gain yet (README, "How fast, measured").
JOB_DELIVERY_LINGER_MS = env_int("JOB_DELIVERY_LINGER_MS", 0)
# While a delivery message for a cluster waits for a worker, jobs accepted for it send none (that run delivers
# them); a wake whose message was lost lapses after this long (jobs/sync_schedule.py).
JOB_DELIVERY_WAKE_SECONDS = env_int("JOB_DELIVERY_WAKE_SECONDS", 10)
# Live logs: one reader per file per process wakes the file's viewers when inotify reports a change in its
# directory. It also looks at the file every JOB_LOG_POLL_SECONDS (one lstat per file, whatever the number of
# viewers): the fallback for a missed event and for filesystems that report no changes made on other hosts
# (NFS written by compute nodes). JOB_LOG_FORCE_POLLING turns inotify off: then lower the poll, e.g. to 0.2.
JOB_LOG_POLL_SECONDS = float(env_str("JOB_LOG_POLL_SECONDS", "1.0"))
JOB_LOG_FORCE_POLLING = env_bool("JOB_LOG_FORCE_POLLING", False)

# Quotas: usage thresholds (percent of granted, counting reservations) that alert managers and tenant admins
# once per allocation. (QUOTA_LIMIT_SYNC_INTERVAL_SECONDS, 60: how often workers bring Slurm's GPU-minute
# limits in line with the allocations; see CELERY_BEAT_SCHEDULE.)
QUOTA_ALERT_THRESHOLDS = tuple(int(part) for part in env_str("QUOTA_ALERT_THRESHOLDS", "50,80,100").split(","))

# E-mail: the console backend prints messages in the workers' log; set EMAIL_BACKEND and EMAIL_HOST for real mail.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpu-portal@localhost")
# How links in e-mails start (scheme, host and port of the portal as users reach it).
PORTAL_BASE_URL = env_str("PORTAL_BASE_URL", "http://127.0.0.1:8000").rstrip("/")

# Billing: invoices of a month are finalised automatically this long after it ends (usage of jobs that ended
# in the month keeps arriving for a moment; later usage goes on the next month's invoice as late usage).
BILLING_FINALISE_AFTER_HOURS = env_int("BILLING_FINALISE_AFTER_HOURS", 24)
# Job transitions older than this many calendar months move to the archive table (jobs/history_archive.py), in
# batches, every JOB_HISTORY_ARCHIVE_INTERVAL_SECONDS; timelines and the tenant's export read both. 0: never.
HISTORY_ARCHIVE_AFTER_MONTHS = env_int("HISTORY_ARCHIVE_AFTER_MONTHS", 6)
JOB_HISTORY_ARCHIVE_BATCHES_PER_RUN = env_int("JOB_HISTORY_ARCHIVE_BATCHES_PER_RUN", 200)
# The submit reply carries a cost estimate from this function (jobs cannot import billing, which depends on it).
JOB_ESTIMATE_FUNCTION = env_str("JOB_ESTIMATE_FUNCTION", "billing.estimates.job_estimate_data")

# The local development cluster that `make cluster` starts; `seed_demo` registers it as "local".
LOCAL_CLUSTER_URL = env_str("LOCAL_CLUSTER_URL", "http://127.0.0.1:6820")
LOCAL_CLUSTER_KEY_FILE = env_str("LOCAL_CLUSTER_KEY_FILE", "/etc/slurm/jwt_hs256.key")
LOCAL_CLUSTER_LOG_ROOT = env_str("LOCAL_CLUSTER_LOG_ROOT", "/srv/gpuportal/logs")
LOCAL_CLUSTER_ADMIN_USER = env_str("LOCAL_CLUSTER_ADMIN_USER", "root")
# Where `scripts/cluster.sh up` describes the newer local clusters (Slurm 24.11 "north", 26.05 "south") it started;
# `seed_demo` registers those that are up.
DEMO_CLUSTER_REGISTRY = env_str("DEMO_CLUSTER_REGISTRY", "/var/lib/gpuportal/clusters")
# The demo's Prometheus (scripts/prometheus.sh), which scrapes the DCGM replay exporter of the demo's clusters: each
# demo cluster reads its GPU utilisation from it. Empty: none.
DEMO_DCGM_PROMETHEUS_URL = env_str("DEMO_DCGM_PROMETHEUS_URL", "http://127.0.0.1:9090")

DEMO_PASSWORD = env_str("DEMO_PASSWORD", "demo")

# Logs (portal/logs.py, README "Logs and tracing a job"): one JSON object per line on stderr, each carrying the
# request id and, where known, the job and cluster it is about; `plain` is for people reading a terminal.
LOGGING = logging_config(
    log_format=env_str("PORTAL_LOG_FORMAT", "json"), level=env_str("PORTAL_LOG_LEVEL", "INFO").upper()
)

# /healthz calls a cluster's health stale when no worker has pinged it for this long.
CLUSTER_HEALTH_STALE_SECONDS = env_int("CLUSTER_HEALTH_STALE_SECONDS", 120)
