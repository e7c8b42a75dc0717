"""A scratch PostgreSQL database for tests that need the real thing (row locks, several
processes): created on the local server, dropped afterwards."""

import contextlib
import json
import os
import subprocess
import sys
import uuid

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class Unavailable(Exception):
    """PostgreSQL (or psycopg) is not there; the caller skips with this reason."""


@contextlib.contextmanager
def scratch_database(prefix: str = "tokenstream_test"):
    """Yields a DATABASE_URL for a new, empty database."""
    try:
        import psycopg
    except ImportError as exc:
        raise Unavailable(f"psycopg is not installed ({exc})") from None
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        raise Unavailable(f"PostgreSQL is not running at 127.0.0.1:5432 ({exc})") from None
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def json_from_child(code: str, database_url: str, timeout: float = 120) -> dict:
    """Runs Python `code` in a process of its own with DATABASE_URL set (Django's settings
    read it at start, so a test process on SQLite cannot switch): its last line of output as
    JSON. The child's stderr is the assertion's message when it fails."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": os.environ.get(
            "DJANGO_SETTINGS_MODULE", "tokenstream_site.settings"
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
