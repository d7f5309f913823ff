"""The admin token: made at first start, stored hashed, the raw token written once to a file
only its owner can read (`admin_token`, beside the database)."""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from sqlalchemy.orm import Session

from officellm.app.db.database import Database
from officellm.app.db.install_settings import ADMIN_TOKEN_HASH, get_setting, set_setting
from officellm.app.db.keys import hash_key
from officellm.app.db.private_file import write_private_file

ADMIN_TOKEN_PREFIX = "ocl-admin-"


def _make_token(db: Database, session: Session) -> Path:
    raw = ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    path = db.admin_token_path
    # File first, hash second: a crash in between leaves a file whose token will be replaced
    # at the next start, never a stored hash nobody holds the token for.
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_file(path, raw + "\n")
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
