"""The API keys table (`GET /admin/keys`): only prefixes, never the keys themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admin_ui.models.record_table import Column, RecordTableModel


@dataclass
class KeyRow:
    id: int
    prefix: str
    user: str
    created: str
    last_used: str
    revoked: bool

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyRow:
        return cls(id=int(d.get("id") or 0), prefix=str(d.get("prefix", "")),
                   user=str(d.get("user", "")), created=str(d.get("created") or ""),
                   last_used=str(d.get("last_used") or ""),
                   revoked=bool(d.get("revoked")))


class KeysModel(RecordTableModel[KeyRow]):
    columns = [
        Column("ID", lambda k: str(k.id), sort_key=lambda k: k.id, numeric=True),
        Column("Key", lambda k: f"{k.prefix}…"),
        Column("User", lambda k: k.user),
        Column("Status", lambda k: "revoked" if k.revoked else "active"),
        Column("Created", lambda k: k.created[:19]),
        Column("Last used", lambda k: k.last_used[:19] or "never"),
    ]
