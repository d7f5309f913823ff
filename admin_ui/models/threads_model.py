"""The Threads table: every active conversation, its length drawn against the user's cap."""

from __future__ import annotations

from officellm.admin_ui.format import ago
from officellm.admin_ui.models.record_table import Column, RecordTableModel
from officellm.admin_ui.snapshot import ActiveThread

CAP_COLUMN = 4  # drawn by CapBarDelegate


def cap_text(t: ActiveThread) -> str:
    if not t.cap:
        return "no cap"
    return f"{t.length:,} / {t.cap:,} ({t.length / t.cap:.0%})"


class ThreadsModel(RecordTableModel[ActiveThread]):
    columns = [
        Column("User", lambda t: t.user),
        Column("Thread", lambda t: t.thread_key[:12], tooltip=lambda t: t.thread_key),
        Column("Length (tokens)", lambda t: f"{t.length:,}", sort_key=lambda t: t.length,
               numeric=True),
        Column("Turns", lambda t: str(t.turns), sort_key=lambda t: t.turns, numeric=True),
        # Sorting by cap use puts the threads about to hit their limit on top.
        Column("Against cap", cap_text,
               sort_key=lambda t: t.fraction_of_cap if t.fraction_of_cap is not None else -1.0),
        Column("Last seen", lambda t: ago(t.last_seen), sort_key=lambda t: str(t.last_seen or ""),
               tooltip=lambda t: str(t.last_seen or "")),
    ]
