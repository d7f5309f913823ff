"""Where officellm keeps its database and admin token by default."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DB_FILENAME = "officellm.db"
ADMIN_TOKEN_FILENAME = "admin_token"
JWT_SECRETS_DIRNAME = "jwt_secrets"


def default_data_dir() -> Path:
    """The per-user data directory (e.g. ~/.local/share/officellm); OFFICELLM_DATA_DIR overrides."""
    override = os.environ.get("OFFICELLM_DATA_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("officellm", appauthor=False))


def default_db_path() -> Path:
    """The database file used when no `--db` is given."""
    return default_data_dir() / DB_FILENAME


def admin_token_path(db_path: Path) -> Path:
    """The admin token file lives beside its database, so a `--db` elsewhere gets its own token."""
    return Path(db_path).parent / ADMIN_TOKEN_FILENAME


def jwt_secrets_dir(db_path: Path) -> Path:
    """Front-end keys' JWT secrets live beside their database too (app/db/jwt_secrets.py)."""
    return Path(db_path).parent / JWT_SECRETS_DIRNAME
