"""The relay benchmark's --database-url: a missing PostgreSQL database is created (the
documented command works on a fresh machine), an existing one is kept, and a server that
cannot be reached stops the run with a sentence instead of a pool timeout."""

import uuid

import pytest

from bench.relay.database import DatabaseUnavailable, ensure_database
from tests.support.postgres import ADMIN_URL


@pytest.fixture
def admin():
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL is not running at 127.0.0.1:5432 ({exc})")
    with conn:
        yield conn


def exists(admin, name: str) -> bool:
    return bool(admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone())


def test_a_missing_database_is_created_once_and_then_kept(admin):
    name = f"bench_relay_test_{uuid.uuid4().hex[:8]}"
    url = f"postgres://postgres@127.0.0.1:5432/{name}"
    try:
        assert ensure_database(url) is True
        assert exists(admin, name)
        assert ensure_database(url) is False
        assert exists(admin, name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_sqlite_urls_are_left_alone(tmp_path):
    assert ensure_database(f"sqlite:///{tmp_path / 'db.sqlite3'}") is False
    assert not (tmp_path / "db.sqlite3").exists()


def test_an_unreachable_server_stops_the_run_with_a_sentence():
    psycopg = pytest.importorskip("psycopg")
    del psycopg
    with pytest.raises(DatabaseUnavailable, match="cannot reach PostgreSQL"):
        ensure_database("postgres://postgres@127.0.0.1:1/bench_relay")
