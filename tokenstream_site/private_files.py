"""Files under var/ (the SQLite database, the generated secret key) hold every user's
conversations and what signs their sessions: readable by the site's own account only, from
the moment they exist. Files made by an older version are narrowed at start."""

import os
import stat
from pathlib import Path

SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def _narrow(path: Path, allowed: int) -> None:
    try:
        current = stat.S_IMODE(path.stat().st_mode)
        if current & ~allowed:
            os.chmod(path, current & allowed)
    except OSError:
        pass  # not ours to change (a directory the operator set up): their choice


def private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _narrow(path, 0o700)


def private_file(path: Path) -> None:
    """Creates the file empty if missing (SQLite takes an empty file as a new database)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    _narrow(path, 0o600)


def private_sqlite(path: Path) -> None:
    """SQLite gives its -wal and -shm files the database file's permissions."""
    private_dir(path.parent)
    private_file(path)
    for suffix in SQLITE_COMPANIONS:
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            _narrow(companion, 0o600)


def write_private(path: Path, text: str) -> None:
    """Write a file no one else can read, replacing it in one step."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, path)
