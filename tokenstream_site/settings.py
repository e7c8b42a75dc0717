"""Settings for tokenstream. Every integration switches on only when its variable is set;
the defaults serve one machine (SQLite, in-memory channel layer, local inference server)."""

import ipaddress
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from tokenstream_site.private_files import private_dir, private_sqlite

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TOKENSTREAM_VAR_DIR", BASE_DIR / "var"))
private_dir(VAR_DIR)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def env_optional_float(name: str, default: float | None) -> float | None:
    """A number, or None when the variable is set but empty."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return float(raw) if raw.strip() else None


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and not env_bool("TOKENSTREAM_DEV_SECRET", True):
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set in production.")
    # A key generated per machine and kept under var/: never a production default in code.
    from tokenstream_site.devsecret import dev_secret_key

    SECRET_KEY = dev_secret_key(VAR_DIR)

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_eventstream",
    "chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "chat.current_user.CurrentUserMiddleware",  # Django's, the user read by one plain SELECT
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chat.middleware.AdminContentSecurityPolicy",
]

ROOT_URLCONF = "tokenstream_site.urls"
ASGI_APPLICATION = "tokenstream_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "chat.context_processors.site_flags",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}", conn_max_age=0)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the relay's flushes and page reads proceed side by side; the busy timeout
    # rides out a brief lock instead of failing a flush.
    if DATABASES["default"]["NAME"] and DATABASES["default"]["NAME"] != ":memory:":
        private_sqlite(Path(DATABASES["default"]["NAME"]))
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Each thread that runs Django's sync code has a connection of its own: the site's
    # request threads (tokenstream_site/handlers.py) keep theirs, and the /v1 API's
    # requests each get a thread of their own; 200 such threads at once exhausted
    # PostgreSQL's 100 connections (measured). A pool makes a burst wait for a connection
    # instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": env_int("DATABASE_POOL_SIZE", 20),
        "timeout": env_float("DATABASE_POOL_TIMEOUT", 30.0),
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Counters of the sign-in and sign-up limits: in Redis when there is one, so that every
# site process counts the same guesses.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "chat.cache.RedisCache",  # one client per pool: see there
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "tokenstream",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Every request reads its session: from this cache, written through to the database, which
# answers when the cache does not have it (reading the database row each time was ~8% of a
# send's CPU). A cache of their own, so that sessions never push the sign-in limits'
# counters out of a bounded local cache. Shared by every process with Redis; in this
# process's memory without (one process only: a sign-out in another process would not
# reach this one's copy).
CACHES["sessions"] = {
    **CACHES["default"],
    "LOCATION": CACHES["default"].get("LOCATION", "sessions"),
    "KEY_PREFIX": "tokenstream-session",
    "OPTIONS": {} if REDIS_URL else {"MAX_ENTRIES": 20000},
}
SESSION_ENGINE = "chat.sessions"  # cached_db, one cache client per process: see there
SESSION_CACHE_ALIAS = "sessions"

# The event log behind django-eventstream: see chat/streaming/memory_log.py for why not
# DjangoModelStorage.
# With Redis, every site process shares one log and receives every event
# (chat/streaming/delivery.py; not django-eventstream's EVENTSTREAM_REDIS).
EVENTSTREAM_STORAGE_CLASS = "chat.streaming.memory_log.MemoryEventStorage"
if REDIS_URL:
    EVENTSTREAM_STORAGE_CLASS = "chat.streaming.redis_log.RedisEventStorage"
EVENTSTREAM_CHANNELMANAGER_CLASS = "chat.streaming.memory_log.ConversationChannelManager"
EVENTLOG_MAX_EVENTS_PER_CHANNEL = env_int("EVENTLOG_MAX_EVENTS_PER_CHANNEL", 20000)
# The in-memory log's bound over all channels; the least recently used go first.
EVENTLOG_MAX_BYTES = env_int("EVENTLOG_MAX_BYTES", 256 * 1024 * 1024)
# Sync requests (pages, the site JSON API) served at once per process, each in a thread
# of a pool that keeps its database connection (tokenstream_site/handlers.py).
REQUEST_THREADS = max(1, env_int("SITE_REQUEST_THREADS", 2))
# Their scheduling priority below the relay's (Linux nice, 0 to 19; 0: the same).
REQUEST_NICE = min(19, max(0, env_int("SITE_REQUEST_NICE", 10)))
# Open event streams per user and per process (0: half the process's open-file limit).
EVENTS_MAX_STREAMS_PER_USER = env_int("EVENTS_MAX_STREAMS_PER_USER", 20)
EVENTS_MAX_STREAMS = env_int("EVENTS_MAX_STREAMS", 0)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every start without it
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE = env_bool("DJANGO_SECURE", not DEBUG and env_bool("DJANGO_HTTPS", False))
if SECURE:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# --- tokenstream ---
SIGNUP_ENABLED = env_bool("TOKENSTREAM_SIGNUP", True)
# Share links (/s/<token>/) are readable by signed-in users; 1: by anyone with the link.
SHARE_PUBLIC = env_bool("TOKENSTREAM_SHARE_PUBLIC", False)
# Accounts one client address may create per hour.
SIGNUPS_PER_HOUR = env_int("TOKENSTREAM_SIGNUPS_PER_HOUR", 10)
# Sign-in guessing (chat/auth.py): free failures per account and address (or device), then
# delays doubling from LOGIN_DELAY_SECONDS to LOGIN_LOCKOUT_SECONDS, the window failures are
# remembered in; and wide limits per address and per account that trusted browsers skip.
LOGIN_MAX_FAILURES = env_int("LOGIN_MAX_FAILURES", 5)
LOGIN_DELAY_SECONDS = env_int("LOGIN_DELAY_SECONDS", 30)
LOGIN_LOCKOUT_SECONDS = env_int("LOGIN_LOCKOUT_SECONDS", 900)
LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("LOGIN_MAX_FAILURES_PER_ADDRESS", 50)
LOGIN_MAX_FAILURES_PER_ACCOUNT = env_int("LOGIN_MAX_FAILURES_PER_ACCOUNT", 100)
# Reverse proxies whose X-Forwarded-For is believed (addresses or networks). Empty: the
# client is REMOTE_ADDR, whatever the headers say.
try:
    TRUSTED_PROXIES = [
        str(ipaddress.ip_network(entry, strict=False))
        for entry in env_list("TOKENSTREAM_TRUSTED_PROXIES", "")
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"TOKENSTREAM_TRUSTED_PROXIES: {exc}") from None
INFERENCE_CLIENT = os.environ.get(
    "INFERENCE_CLIENT", "chat.inference_client.http.HttpInferenceClient"
)
INFERENCE_URLS = env_list("INFERENCE_URLS", "http://127.0.0.1:8001")
INFERENCE_API_KEY = os.environ.get("INFERENCE_API_KEY", "")
INFERENCE_MODEL = os.environ.get("INFERENCE_MODEL", "")
# How long the servers' model list is trusted when checking a conversation's `model`.
INFERENCE_MODELS_CACHE_SECONDS = env_int("INFERENCE_MODELS_CACHE_SECONDS", 60)
# Seconds: connecting, waiting for the first token (again after each chunk without text, such
# as a progress report), and silence between two pieces of text.
INFERENCE_CONNECT_TIMEOUT = env_float("INFERENCE_CONNECT_TIMEOUT", 5.0)
INFERENCE_FIRST_TOKEN_TIMEOUT = env_float("INFERENCE_FIRST_TOKEN_TIMEOUT", 120.0)
INFERENCE_READ_TIMEOUT = env_float("INFERENCE_READ_TIMEOUT", 30.0)
# Ask the server for the prompt's progress while it reads a long one (llama.cpp's
# `return_progress`, which ours speaks too; vLLM ignores it). A server that refuses the field
# is asked again without it (chat/inference_client/http.py); 0: never sent.
INFERENCE_PROMPT_PROGRESS = env_bool("INFERENCE_PROMPT_PROGRESS", True)
# How long to keep retrying a busy (503) inference server before failing the reply.
INFERENCE_BUSY_RETRY_SECONDS = env_float("INFERENCE_BUSY_RETRY_SECONDS", 20.0)
# Tokens the model can see; the history is trimmed to fit it with room for the reply.
INFERENCE_CONTEXT_TOKENS = env_int("INFERENCE_CONTEXT_TOKENS", 8192)
FAKE_TOKENS_PER_SECOND = env_float("FAKE_TOKENS_PER_SECOND", 20.0)

CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 32000)
CHAT_MAX_SYSTEM_PROMPT_CHARS = env_int("CHAT_MAX_SYSTEM_PROMPT_CHARS", 8000)
CHAT_MAX_TITLE_CHARS = 200
# Messages in one page of GET /api/conversations/<id>/ (newest first; ?before= for earlier).
CHAT_MESSAGES_PAGE_SIZE = env_int("CHAT_MESSAGES_PAGE_SIZE", 100)
CHAT_DEFAULT_MAX_TOKENS = env_int("CHAT_DEFAULT_MAX_TOKENS", 1024)
# Sampling for conversations that set none. OpenAI-style servers default to temperature 1,
# which turns a small model like the bundled 135M one into word salad; 0.5 / 0.9 keep it on
# topic and still vary the answers.
CHAT_DEFAULT_TEMPERATURE = env_float("CHAT_DEFAULT_TEMPERATURE", 0.5)
CHAT_DEFAULT_TOP_P = env_float("CHAT_DEFAULT_TOP_P", 0.9)
# Against repetition loops, chosen with bench/quality.py on the bundled model (bench/README.md).
# A conversation or preset may set its own; "" (empty) sends none, leaving the server's.
CHAT_DEFAULT_REPETITION_PENALTY = env_optional_float("CHAT_DEFAULT_REPETITION_PENALTY", None)
CHAT_DEFAULT_FREQUENCY_PENALTY = env_optional_float("CHAT_DEFAULT_FREQUENCY_PENALTY", 0.8)
CHAT_DEFAULT_PRESENCE_PENALTY = env_optional_float("CHAT_DEFAULT_PRESENCE_PENALTY", 0.3)
CHAT_DEFAULT_TOP_K = env_optional_float("CHAT_DEFAULT_TOP_K", None)
CHAT_DEFAULT_MIN_P = env_optional_float("CHAT_DEFAULT_MIN_P", 0.1)
CHAT_MAX_STREAMING_PER_USER = env_int("CHAT_MAX_STREAMING_PER_USER", 3)
# Replies started per minute: sends, edits and regenerates alike.
CHAT_MESSAGES_PER_MINUTE = env_int("CHAT_MESSAGES_PER_MINUTE", 30)
CHAT_CONVERSATIONS_PER_MINUTE = env_int("CHAT_CONVERSATIONS_PER_MINUTE", 20)
# Tokens (prompt + completion) a user may use per UTC day and per calendar month; unset or
# 0: no limit. Overridable per user and per group in the admin (Token quotas).
CHAT_DAILY_TOKEN_QUOTA = env_int("CHAT_DAILY_TOKEN_QUOTA", 0)
CHAT_MONTHLY_TOKEN_QUOTA = env_int("CHAT_MONTHLY_TOKEN_QUOTA", 0)
# Active API keys one user may hold.
CHAT_MAX_API_KEYS_PER_USER = env_int("CHAT_MAX_API_KEYS_PER_USER", 20)
# The relay writes streamed text at least this often (seconds).
RELAY_FLUSH_INTERVAL = env_float("RELAY_FLUSH_INTERVAL", 0.5)
# A reply whose relay has not written for this long is taken to be orphaned.
RELAY_STALE_AFTER = env_float("RELAY_STALE_AFTER", 15.0)
# Put the inference server's production timestamp in token events (for bench/relay.py).
RELAY_EVENT_TIMESTAMPS = env_bool("RELAY_EVENT_TIMESTAMPS", False)

DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django_eventstream": {"level": "WARNING"}},
}
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

# deploy/tokenstream.env ships "change-me" values: a site started with them unedited would
# sign sessions with a key everyone can read.
PLACEHOLDER = "change-me"
_placeholders = [
    name
    for name, value in [
        ("DJANGO_SECRET_KEY", SECRET_KEY),
        ("METRICS_TOKEN", METRICS_TOKEN),
        ("INFERENCE_API_KEY", INFERENCE_API_KEY),
    ]
    if PLACEHOLDER in value.lower()
]
if _placeholders and not DEBUG:
    raise ImproperlyConfigured(
        f"{', '.join(_placeholders)} still hold the placeholder of deploy/tokenstream.env: "
        "set a random value (python -c 'import secrets; print(secrets.token_urlsafe(50))')."
    )
