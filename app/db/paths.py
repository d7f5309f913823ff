"""Where officellm keeps its database and admin token by default.

The data directory and the admin-token file's name come from the leaf package `data_dir`,
which the console reads too (it finds a local server's token there without importing app).
"""

from __future__ import annotations

from pathlib import Path

from officellm.installer.paths import ADMIN_TOKEN_FILENAME, default_data_dir

DB_FILENAME = "officellm.db"
JWT_SECRETS_DIRNAME = "jwt_secrets"


def default_db_path() -> Path:
    """The database file used when no `--db` is given."""
    return default_data_dir() / DB_FILENAME


def admin_token_path(files_dir: Path) -> Path:
    """The admin token file in a database's files directory (Database: beside a SQLite file,
    so a `--db` elsewhere gets its own token)."""
    return Path(files_dir) / ADMIN_TOKEN_FILENAME


def jwt_secrets_dir(files_dir: Path) -> Path:
    """Front-end keys' JWT secrets, in the same directory (app/db/jwt_secrets.py)."""
    return Path(files_dir) / JWT_SECRETS_DIRNAME


def kv_disk_dir(files_dir: Path) -> Path:
    """The KV cache's disk tier under `--kv-disk-dir auto`, in the same directory: its
    blocks are sealed under the install key beside it (docs/kv_tiers.md)."""
    return Path(files_dir) / "kv-cache"
