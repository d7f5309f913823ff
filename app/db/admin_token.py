"""The admin token: made at first start, stored hashed, the raw token written once to a file
only its owner can read (`admin_token`, beside the database)."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from sqlalchemy.orm import Session

from app.db.database import Database
from app.db.install_settings import ADMIN_TOKEN_HASH, get_setting, set_setting
from app.db.keys import hash_key

ADMIN_TOKEN_PREFIX = "ocl-admin-"


def _write_private(path: Path, content: str) -> None:
    # Created with mode 0600 from the start (no window where it is world-readable), under a
    # temporary name and renamed, so a reader never sees half a token.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, content.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)  # in case the umask was odd; O_CREAT's mode is already 0600 or less
    os.replace(tmp, path)


def _make_token(db: Database, session: Session) -> Path:
    raw = ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    path = db.admin_token_path
    # File first, hash second: a crash in between leaves a file whose token will be replaced
    # at the next start, never a stored hash nobody holds the token for.
    _write_private(path, raw + "\n")
    set_setting(session, ADMIN_TOKEN_HASH, hash_key(raw))
    return path


def ensure_admin_token(db: Database) -> Path | None:
    """Make the admin token if this database has none; return the file written, else None."""
    with db.transaction() as session:
        if get_setting(session, ADMIN_TOKEN_HASH) is not None:
            return None
        return _make_token(db, session)


def reset_admin_token(db: Database) -> Path:
    """Replace the admin token (the old one stops working); return the file written."""
    with db.transaction() as session:
        return _make_token(db, session)


def verify_admin_token(session: Session, raw: str) -> bool:
    """True when `raw` is the current admin token (constant-time comparison)."""
    stored = get_setting(session, ADMIN_TOKEN_HASH)
    if stored is None or not raw:
        return False
    return hmac.compare_digest(stored, hash_key(raw))
