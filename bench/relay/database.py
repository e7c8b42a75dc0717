"""The benchmark's own PostgreSQL database: created when --database-url names one that does
not exist yet (the run migrates it anyway), so the documented command works on a fresh
machine instead of timing out in the site's connection pool."""

from urllib.parse import unquote, urlsplit, urlunsplit


class DatabaseUnavailable(SystemExit):
    """The server in --database-url cannot be reached: the run stops with this message."""


def ensure_database(url: str) -> bool:
    """Creates the PostgreSQL database `url` names if it is missing; whether it did. Other
    database kinds are left alone (SQLite creates its file itself)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        return False
    import psycopg
    from psycopg import sql

    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise DatabaseUnavailable(f"--database-url {url!r} names no database")
    admin_url = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    try:
        admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"cannot reach PostgreSQL for --database-url {url!r}: {exc}".strip()
        ) from None
    with admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return True
