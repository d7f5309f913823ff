"""Install-wide settings in the `settings` table (string values)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.db.tables import Setting

TRANSCRIPTS_ENABLED = "transcripts_enabled"
ADMIN_TOKEN_HASH = "admin_token_hash"


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


def transcripts_enabled(session: Session) -> bool:
    """Whether message content may be stored (DESIGN §6: off unless the admin turns it on)."""
    return get_setting(session, TRANSCRIPTS_ENABLED, "false") == "true"


def set_transcripts_enabled(session: Session, enabled: bool) -> None:
    """Turn transcripts on or off."""
    set_setting(session, TRANSCRIPTS_ENABLED, "true" if enabled else "false")
