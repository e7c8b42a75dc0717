"""A secret key made once per machine for development, so no key ships in the code."""

import secrets
from pathlib import Path


def dev_secret_key(var_dir: Path) -> str:
    path = Path(var_dir) / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(key)
    tmp.chmod(0o600)
    tmp.replace(path)
    return path.read_text().strip()
