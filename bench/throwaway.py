"""Throwaway databases for the benchmarks that measure the site in-process, each in a child
process of its own (Django's settings are read once per process)."""

import contextlib
import os
import subprocess
import sys
import uuid


def run_child(module: str, argv: list[str], *, database_url: str, var_dir: str, **env) -> int:
    """`python -m module --child argv…` against database_url, its files under var_dir."""
    child_env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TOKENSTREAM_VAR_DIR": var_dir,
        "DJANGO_SETTINGS_MODULE": "tokenstream_site.settings",
        "LOG_LEVEL": "WARNING",
        **env,
    }
    command = [sys.executable, "-m", module, "--child", *argv]
    return subprocess.run(command, env=child_env).returncode


@contextlib.contextmanager
def postgres_database(server_url: str):
    """A new database on server_url's PostgreSQL server, dropped afterwards: yields its URL,
    or None once it has printed why the server could not be reached."""
    try:
        import psycopg

        admin = psycopg.connect(
            server_url.replace("postgres://", "postgresql://"), autocommit=True, connect_timeout=3
        )
    except Exception as exc:  # not installed, not running: say so and go on
        print(f"\nPostgreSQL: skipped ({exc})")
        yield None
        return
    name = f"tokenstream_bench_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server_url.rsplit('/', 1)[0]}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
