"""Settings for Chatflow Console, read from the environment through django-environ only.

Defaults just work for a developer (DEBUG on, a SQLite file under ``var/``, the in-memory channel
layer, the offline demo engine); malformed values stop start-up with an ``ImproperlyConfigured``
naming the variable. Every variable is listed in ``.env.example``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from chatflow_site.layers import redis_layer

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()

# An env file (default: .env in the repository) fills variables not already in the environment.
# CHATFLOW_ENV_FILE="" reads none (the test runner does this so a developer's .env cannot leak in).
_env_file = env.str("CHATFLOW_ENV_FILE", default=str(BASE_DIR / ".env"))
if _env_file and Path(_env_file).is_file():
    environ.Env.read_env(_env_file)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(name: str, default: bool) -> bool:
    """Strict boolean: 1/0, true/false, yes/no, on/off (any case); anything else is an error."""
    raw = env.str(name, default="").strip().lower()
    if raw == "":
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def _positive_int(name: str, default: int, maximum: int = 10**9, unit: str = "") -> int:
    """The variable as an integer from 1 to ``maximum`` (``unit`` names what it counts, for the error)."""
    return _whole(name, default, 1, maximum, unit)


def _non_negative_int(name: str, default: int, maximum: int = 10**9, unit: str = "") -> int:
    """The variable as an integer from 0 to ``maximum`` (``unit`` names what it counts, for the error)."""
    return _whole(name, default, 0, maximum, unit)


def _whole(name: str, default: int, minimum: int, maximum: int, unit: str) -> int:
    raw = env.str(name, default="").strip()
    if raw == "":
        return default
    if not re.fullmatch(r"\+?[0-9]{1,18}", raw) or not minimum <= int(raw) <= maximum:
        what = f"a whole number of {unit}" if unit else "a whole number"
        raise ImproperlyConfigured(f"{name} must be {what} from {minimum} to {maximum}; got {raw!r}")
    return int(raw)


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.str(name, default="").strip().lower() or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return raw


def _list(name: str, default: list[str]) -> list[str]:
    raw = env.str(name, default="")
    if not raw.strip():
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def _usd(name: str) -> Decimal | None:
    """The variable as a positive amount of US dollars (``0.50``), None when unset or 0."""
    raw = env.str(name, default="").strip()
    if raw == "":
        return None
    if not re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,10})?", raw):
        raise ImproperlyConfigured(f"{name} must be an amount of US dollars such as 0.50 (0: no limit); got {raw!r}")
    return Decimal(raw) or None


def _redact(url: str) -> str:
    """The URL without its password, for error messages."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def database_config(url: str) -> dict:
    """A DATABASES entry from a DATABASE_URL-style URL (sqlite or postgres only: the migrations speak those
    two), with the site's options for that database; ``ImproperlyConfigured`` for any other URL."""
    prepared = _bool("CHATFLOW_PG_PREPARED_STATEMENTS", default=True)  # refused when malformed, on SQLite too
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme not in {"sqlite", "postgres", "postgresql", "pgsql", "psql"}:
        raise ImproperlyConfigured(
            "DATABASE_URL must be a sqlite:///path or postgres://user@host:port/name URL; "
            f"got {_redact(url)!r}"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = env.db_url_config(url)
    if not config.get("NAME"):
        raise ImproperlyConfigured(f"DATABASE_URL names no database; got {_redact(url)!r}")
    if config["ENGINE"] == "django.db.backends.sqlite3":
        if config["NAME"] != ":memory:" and not config["NAME"].startswith("file:"):
            Path(config["NAME"]).parent.mkdir(parents=True, exist_ok=True)
        config["OPTIONS"] = {
            # WAL lets the console read while a bot process writes; IMMEDIATE takes the write lock at
            # BEGIN so two writers queue on busy_timeout instead of failing with "database is locked".
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout=20000",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        # A file (not Django's default in-memory database) so tests see WAL, leases and other processes;
        # one per test process, so test runs in the same checkout never share (and delete) a database.
        config["TEST"] = {"NAME": str(Path(tempfile.gettempdir()) / f"chatflow-test-{os.getpid()}.db")}
    else:
        config["CONN_HEALTH_CHECKS"] = True
        # The session store's and the queue's statements run on server-binding cursors
        # (sessions_app.store.driver_cursor), which psycopg prepares after this many runs on a connection;
        # Django's own cursors bind on the client and never prepare. Off (None) behind a pooler in
        # transaction mode that does not keep prepared statements.
        options = config.setdefault("OPTIONS", {})
        options.setdefault("prepare_threshold", 5 if prepared else None)
        config["TEST"] = {"NAME": f"test_{config['NAME']}_{os.getpid()}"}
    return config


DEBUG = _bool("DEBUG", default=True)

SECRET_KEY = env.str("SECRET_KEY", default="").strip()
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off (generate one: "
                                   "python -c 'import secrets; print(secrets.token_urlsafe(50))')")
    SECRET_KEY = "django-insecure-chatflow-console-development-key-do-not-use-in-production"

ALLOWED_HOSTS = _list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = _list("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    if not re.match(r"^https?://[^/]+$", _origin):
        raise ImproperlyConfigured(f"CSRF_TRUSTED_ORIGINS entries must look like https://host[:port]; got {_origin!r}")

DATABASE_URL = env.str("DATABASE_URL", default="").strip() or f"sqlite:///{VAR_DIR / 'chatflow.db'}"
DATABASES = {"default": database_config(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "servestatic",
    "channels",
    "django_htmx",
    "template_partials",
    "ninja",  # its templates and vendored Swagger UI assets: the API docs page works offline
    "csp",
    "axes",  # login throttling (AXES_* below); its lockouts are in the admin, where deleting one lifts it
    "sessions_app",
    "search_app",
    "console_app",
    "agents_app",
    "api_app",
    "webhooks_app",
    "turns_app",
    "takeover_app",
    "health_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    # Below the headers every response carries, above every middleware that reads the database: when the database
    # does not answer, a 503 with the reason (the site's page or JSON), not a 500.
    "chatflow_site.errors.DatabaseUnavailable",
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "chatflow_site.errors.RequestTooLarge",  # a form body too large to parse: the site's 413, not a debug page
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "chatflow_site.errors.SiteNotFoundPage",  # the site's 404 page with DEBUG on too
    "axes.middleware.AxesMiddleware",  # last: turns a refused (locked-out) login into the lockout page
]

ROOT_URLCONF = "chatflow_site.urls"
CSRF_FAILURE_VIEW = "chatflow_site.errors.csrf_failure"  # the site's 403 page with what to do
WSGI_APPLICATION = "chatflow_site.wsgi.application"
ASGI_APPLICATION = "chatflow_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,  # template_partials swaps this for its cached partials loader
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

# Channel layer: Redis whenever more than one process serves or runs turns, else in-process.
REDIS_URL = env.str("REDIS_URL", default="").strip()
if REDIS_URL:
    if urlsplit(REDIS_URL).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"REDIS_URL must be a redis://host:port/db URL; got {_redact(REDIS_URL)!r}")
    CHANNEL_LAYERS = {"default": redis_layer(REDIS_URL)}
elif env.str("CHATFLOW_LIVE_RELAY_FD", default="").strip():
    # Set by the server for its embedded worker process only (webhooks_app.embedded): the worker's
    # publishes go to the server over this pipe and out on the server's in-memory layer.
    CHANNEL_LAYERS = {"default": {"BACKEND": "webhooks_app.relay.RelayChannelLayer",
                                  "CONFIG": {"fd": _positive_int("CHATFLOW_LIVE_RELAY_FD", 0)}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before a password is checked
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling (django-axes, sessions_app.lockouts): failed logins counted per account and per address
# (the connection's, or the one the proxy added to X-Forwarded-For when SECURE_PROXY_SSL_HEADER says a proxy
# is there); at the limit both are locked for the cool-off.
# Attempts during a lockout do not extend it; a successful login clears the account's count.
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "sessions_app.lockouts.locked_out"
AXES_CLIENT_IP_CALLABLE = "sessions_app.lockouts.client_address"
AXES_HTTP_RESPONSE_CODE = 429
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Static files: ServeStatic (WhiteNoise's ASGI-native fork) serves them under daphne with DEBUG off too.
# WhiteNoise hands Django a synchronous file iterator, which under ASGI is buffered whole into memory
# with a warning on every request; ServeStatic streams asynchronously. Finders are used so a checkout
# works without collectstatic; `manage.py collectstatic` (into var/static) adds compressed copies.
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
SERVESTATIC_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "servestatic.storage.CompressedStaticFilesStorage"},
}

# Transport security: production defaults whenever DEBUG is off, each one overridable.
SECURE_SSL_REDIRECT = _bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = _bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = _bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = _non_negative_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000, 10 * 31_536_000, "seconds")
SECURE_HSTS_INCLUDE_SUBDOMAINS = _bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = _bool("SECURE_HSTS_PRELOAD", default=not DEBUG)
if _bool("SECURE_PROXY_SSL_HEADER", default=False):
    # Only behind a proxy that sets X-Forwarded-Proto itself (and strips it from clients).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy on every response (django-csp; with DEBUG on too, except Django's own debug
# pages for 404 and 500): scripts, styles and sockets only from this site, no inline script or style, no
# event-handler attributes, no eval. htmx is configured for it in templates/base.html (its htmx-config).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # the console's websockets: same host (CSP Level 3 'self' covers ws/wss)
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"refusal_in_one_line": {"()": "chatflow_site.logfilters.RefusalInOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        **{name: {"level": "INFO"} for name in ("chatflow_agent", "sessions_app", "console_app", "agents_app",
                                                "webhooks_app", "health_app", "takeover_app", "turns_app")},
        # Django's default config gives "django" a console handler of its own; records also reach the
        # root handler, so each 4xx/5xx line printed twice. Configured here, it keeps only the root's.
        "django": {"level": "INFO"},
        "django.request": {"level": "INFO", "filters": ["refusal_in_one_line"]},
    },
}

# --- Chatflow runtime -------------------------------------------------------------------------
CHATFLOW_AGENTS = env.str("CHATFLOW_AGENTS", default="").strip() or "agents_app.demo_team.build"
if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", CHATFLOW_AGENTS):
    raise ImproperlyConfigured(
        f"CHATFLOW_AGENTS must be the dotted path of a factory (package.module.function); got {CHATFLOW_AGENTS!r}"
    )
CHATFLOW_ENGINE = _choice("CHATFLOW_ENGINE", "demo", ("demo", "openai"))
OPENAI_API_KEY = env.str("OPENAI_API_KEY", default="").strip()
OPENAI_BASE_URL = env.str("OPENAI_BASE_URL", default="").strip()
if OPENAI_BASE_URL and urlsplit(OPENAI_BASE_URL).scheme not in {"http", "https"}:
    raise ImproperlyConfigured(f"OPENAI_BASE_URL must be an http(s) URL; got {OPENAI_BASE_URL!r}")
if CHATFLOW_ENGINE == "openai" and not (OPENAI_API_KEY or OPENAI_BASE_URL):
    raise ImproperlyConfigured("OPENAI_API_KEY must be set when CHATFLOW_ENGINE=openai "
                               "(or OPENAI_BASE_URL for a local OpenAI-compatible server)")
CHATFLOW_MAX_TURNS = _positive_int("CHATFLOW_MAX_TURNS", 40, unit="turns")


def _model_prices(name: str) -> dict[str, dict[str, object]]:
    """Per-model price overrides (JSON object: model → {"input", "output", "cached_input", "cache_write"},
    USD per million tokens), checked with the runtime's own rule (``chatflow_agent.pricing``)."""
    from chatflow_agent.pricing import PRICES_ENV, PriceBook

    raw = env.str(name, default="").strip()
    try:
        PriceBook.from_env({PRICES_ENV: raw}, library=False)
    except ValueError as err:
        raise ImproperlyConfigured(str(err).replace(PRICES_ENV, name, 1)) from err
    return json.loads(raw) if raw else {}


# Model prices that win over genai-prices' (a negotiated rate, a model it does not know); see README.
CHATFLOW_MODEL_PRICES = _model_prices("CHATFLOW_MODEL_PRICES")
CHATFLOW_DEDUP_TTL_HOURS = _positive_int("CHATFLOW_DEDUP_TTL_HOURS", 192, 10 * 8_760, "hours")


#: The longest retention a channel may have (days): a hundred years.
RETENTION_MAX_DAYS = 36_500


def retention_days(raw: str, name: str = "CHATFLOW_RETENTION_DAYS") -> dict[str, int]:
    """A retention policy from ``"web=30,whatsapp=180,default=0"``: channel name (lower-cased; ``default`` for
    every channel not listed and sessions without one) → whole days after a session's last message, 0 = kept for
    ever. ``""`` → ``{}`` (everything kept). ``ImproperlyConfigured`` naming ``name`` for a malformed pair, a
    repeated channel or a number outside 0–:data:`RETENTION_MAX_DAYS`."""
    policy: dict[str, int] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        channel, sep, days = (piece.strip() for piece in item.partition("="))
        channel = channel.lower()
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", channel):
            raise ImproperlyConfigured(f"{name} must be channel=days pairs separated by commas "
                                       f"(e.g. web=30,whatsapp=180,default=0); got {item!r}")
        if channel in policy:
            raise ImproperlyConfigured(f"{name} names the channel {channel!r} twice")
        if not re.fullmatch(r"\+?[0-9]{1,6}", days) or int(days) > RETENTION_MAX_DAYS:
            raise ImproperlyConfigured(f"{name} must give {channel} a whole number of days from 0 to "
                                       f"{RETENTION_MAX_DAYS} (0: kept for ever); got {days!r}")
        policy[channel] = int(days)
    return policy


# Days a session is kept after its last message, per channel (sessions_app.retention): "web=30,whatsapp=180,default=0"
# (default: every other channel; 0 or unset: kept for ever). Applied by chatflow_retention and the queue workers.
CHATFLOW_RETENTION_DAYS = retention_days(env.str("CHATFLOW_RETENTION_DAYS", default=""))

# --- Webhook channels (webhooks_app) -----------------------------------------------------------
WHATSAPP_VERIFY_TOKEN = env.str("WHATSAPP_VERIFY_TOKEN", default="").strip()
WHATSAPP_APP_SECRET = env.str("WHATSAPP_APP_SECRET", default="").strip()
WHATSAPP_ACCESS_TOKEN = env.str("WHATSAPP_ACCESS_TOKEN", default="").strip()
WHATSAPP_API_BASE = env.str("WHATSAPP_API_BASE", default="").strip() or "https://graph.facebook.com/v21.0"
TELEGRAM_BOT_TOKEN = env.str("TELEGRAM_BOT_TOKEN", default="").strip()
TELEGRAM_SECRET_TOKEN = env.str("TELEGRAM_SECRET_TOKEN", default="").strip()
TELEGRAM_API_BASE = env.str("TELEGRAM_API_BASE", default="").strip() or "https://api.telegram.org"
CHATFLOW_WEBHOOK_SECRET = env.str("CHATFLOW_WEBHOOK_SECRET", default="").strip()
for _name in ("WHATSAPP_API_BASE", "TELEGRAM_API_BASE"):
    if urlsplit(globals()[_name]).scheme not in {"http", "https"}:
        raise ImproperlyConfigured(f"{_name} must be an http(s) URL; got {globals()[_name]!r}")
CHATFLOW_WEBHOOK_MAX_BYTES = _positive_int("CHATFLOW_WEBHOOK_MAX_BYTES", 256 * 1024, unit="bytes")
# The embedded queue worker (a child process of the server): auto = only under an ASGI server
# (daphne, uvicorn, runserver); on = in every process that loads the site; off = never.
CHATFLOW_EMBEDDED_WORKER = _choice("CHATFLOW_EMBEDDED_WORKER", "auto", ("auto", "on", "off"))
# Where a queue worker process runs (webhooks_app.placement): auto = on one CPU chosen by its pid, off = any
# CPU, or a CPU number; and the nice value it adds (0-19), so web processes answer webhooks first.
CHATFLOW_WORKER_CPU = env.str("CHATFLOW_WORKER_CPU", default="").strip().lower() or "auto"
if CHATFLOW_WORKER_CPU not in ("auto", "off") and not CHATFLOW_WORKER_CPU.isdigit():
    raise ImproperlyConfigured(f"CHATFLOW_WORKER_CPU must be auto, off or a CPU number; got {CHATFLOW_WORKER_CPU!r}")
CHATFLOW_WORKER_NICE = _non_negative_int("CHATFLOW_WORKER_NICE", 10, 19)
# Deliveries a queue worker plays at once (the embedded worker's, and chatflow_worker's unless --slots): each
# slot is a thread with its own database connection. Deliveries that need no model call (a message to a
# session an operator holds, an unsupported type, a reset) have a lane of their own besides these.
CHATFLOW_WORKER_SLOTS = _positive_int("CHATFLOW_WORKER_SLOTS", 4, 64, "slots")
# Seconds a process's claim on work lives without renewal (renewed every third of it): a session's turn
# lease and a webhook delivery's queue lease (its visibility timeout) alike, so it is how long a killed
# process keeps its session and its delivery blocked. One value: a delivery taken over sooner than its
# session's lease would only wait for that lease, and a session freed sooner would still wait for its
# delivery. CHATFLOW_QUEUE_VISIBILITY_SECONDS is its former name, read when CHATFLOW_LEASE_SECONDS is unset.
_former_lease_name = _positive_int("CHATFLOW_QUEUE_VISIBILITY_SECONDS", 0, 86_400, "seconds")  # 0: not set
CHATFLOW_LEASE_SECONDS = _positive_int("CHATFLOW_LEASE_SECONDS", _former_lease_name or 30, 86_400, "seconds")
if _former_lease_name and _former_lease_name != CHATFLOW_LEASE_SECONDS:
    raise ImproperlyConfigured("CHATFLOW_QUEUE_VISIBILITY_SECONDS is the former name of CHATFLOW_LEASE_SECONDS "
                               "and differs from it; set CHATFLOW_LEASE_SECONDS only")

# --- Human takeover (takeover_app) -------------------------------------------------------------
# Phrases (comma-separated; whole words, any case, accents ignored) with which a customer asks for a person: the
# bot session then waits for an operator. A site's list replaces these. The defaults ask for a person in
# English, Portuguese and Spanish, all applied to every message (takeover_app.gate.asks_for_human says why);
# never bare words like "agent" or "operator", which customers write about other things ("my travel agent").
CHATFLOW_HUMAN_PHRASES = _list("CHATFLOW_HUMAN_PHRASES", [
    # English
    "talk to a human", "speak to a human", "talk to a person", "speak to a person", "talk to someone",
    "speak to someone", "speak with someone", "talk to a real person", "real person", "want a human", "need a human",
    "human agent", "live agent", "talk to an agent", "speak to an agent", "talk to an operator", "speak to an operator",
    # Portuguese
    "falar com um atendente", "falar com atendente", "falar com uma pessoa", "falar com um humano",
    "falar com alguem", "quero um humano", "quero um atendente", "atendimento humano", "pessoa real",
    # Spanish
    "hablar con una persona", "hablar con un humano", "hablar con un agente", "hablar con alguien",
    "hablar con un operador", "quiero un humano", "atencion humana", "persona real",
])
# The one answer the customer gets when the session starts waiting for an operator.
CHATFLOW_HOLDING_MESSAGE = env.str("CHATFLOW_HOLDING_MESSAGE", default="").strip() or (
    "I have asked a person from our team to take over; they will answer you here shortly.")
# Consecutive failed turns after which a session waits for an operator (0: never).
CHATFLOW_HUMAN_AFTER_FAILED_TURNS = _non_negative_int("CHATFLOW_HUMAN_AFTER_FAILED_TURNS", 3, unit="failed turns")
# Per-session daily budget (the UTC day; takeover_app.budget): 0 or unset is no limit.
CHATFLOW_BUDGET_TURNS_PER_DAY = _non_negative_int("CHATFLOW_BUDGET_TURNS_PER_DAY", 0, unit="turns")
CHATFLOW_BUDGET_TOKENS_PER_DAY = _non_negative_int("CHATFLOW_BUDGET_TOKENS_PER_DAY", 0, 10**15, "tokens")

CHATFLOW_BUDGET_COST_PER_DAY = _usd("CHATFLOW_BUDGET_COST_PER_DAY")
# Past the budget: the session waits for a person ("wait") or the bot answers CHATFLOW_BUDGET_MESSAGE ("answer").
CHATFLOW_BUDGET_ACTION = _choice("CHATFLOW_BUDGET_ACTION", "wait", ("wait", "answer"))
CHATFLOW_BUDGET_MESSAGE = env.str("CHATFLOW_BUDGET_MESSAGE", default="").strip() or (
    "Thank you for your messages today. We have reached the limit of what we can answer here for today; "
    "please write again tomorrow.")
# Minutes without a customer or operator message after which a waiting/human session returns to the bot (0: never).
CHATFLOW_TAKEOVER_IDLE_MINUTES = _non_negative_int("CHATFLOW_TAKEOVER_IDLE_MINUTES", 0, 525_600, "minutes")

# --- Health page, /metrics, OpenTelemetry (health_app) -----------------------------------------
# A turn still running after this many seconds is listed on the health page as a long-running turn.
CHATFLOW_HEALTH_LONG_TURN_SECONDS = _positive_int("CHATFLOW_HEALTH_LONG_TURN_SECONDS", 120, 7 * 86_400, "seconds")
# Seconds between two heartbeats of a queue worker; a worker silent for three of them is shown stale.
CHATFLOW_HEARTBEAT_SECONDS = _positive_int("CHATFLOW_HEARTBEAT_SECONDS", 5, 3_600, "seconds")
# /metrics answers staff logins and "Authorization: Bearer <this token>" (empty: staff only).
CHATFLOW_METRICS_TOKEN = env.str("CHATFLOW_METRICS_TOKEN", default="").strip()
# OpenTelemetry traces go to this OTLP/HTTP collector (e.g. http://127.0.0.1:4318); empty: no tracing.
# Needs requirements-otel.txt; the standard OTEL_* variables (service name, headers, …) apply.
OTEL_EXPORTER_OTLP_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="").strip()
