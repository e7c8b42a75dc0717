"""A secret key made once per machine for development, so no key ships in the code."""

import secrets
from pathlib import Path

from tokenstream_site.private_files import private_dir, write_private


def dev_secret_key(var_dir: Path) -> str:
    path = Path(var_dir) / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    write_private(path, secrets.token_urlsafe(50))
    # Two processes starting at once each wrote a key; both use the one that stayed.
    return path.read_text().strip()
