"""Install-wide settings in the `settings` table (string values)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from officellm.app.db.tables import Setting

ADMIN_TOKEN_HASH = "admin_token_hash"
# The fingerprint of the install key the database's secrets are sealed under
# (app/db/install_key.py).
INSTALL_KEY_ID = "install_key_id"


def get_setting(session: Session, key: str, default: str | None = None) -> str | None:
    """A setting's value, or `default` when unset."""
    row = session.get(Setting, key)
    return row.value if row is not None else default


def set_setting(session: Session, key: str, value: str) -> None:
    """Create or replace a setting."""
    row = session.get(Setting, key)
    if row is None:
        session.add(Setting(key=key, value=value))
    else:
        row.value = value
    session.flush()
