"""The API keys table (`GET /admin/keys`): only prefixes, never the keys themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from officellm.admin_ui.models.record_table import Column, RecordTableModel


@dataclass
class KeyRow:
    id: int
    prefix: str
    user: str
    created: str
    last_used: str
    revoked: bool
    forwarded_users: bool = False
    jwt_secret: bool = False

    @property
    def kind(self) -> str:
        """"user" for a person's own key; a front-end key speaks for other people."""
        if not self.forwarded_users:
            return "user"
        return "front end (JWT)" if self.jwt_secret else "front end"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyRow:
        return cls(id=int(d.get("id") or 0), prefix=str(d.get("prefix", "")),
                   user=str(d.get("user", "")), created=str(d.get("created") or ""),
                   last_used=str(d.get("last_used") or ""),
                   revoked=bool(d.get("revoked")),
                   forwarded_users=bool(d.get("forwarded_users")),
                   jwt_secret=bool(d.get("jwt_secret")))


class KeysModel(RecordTableModel[KeyRow]):
    columns = [
        Column("ID", lambda k: str(k.id), sort_key=lambda k: k.id, numeric=True),
        Column("Key", lambda k: f"{k.prefix}…"),
        Column("User", lambda k: k.user),
        Column("Kind", lambda k: k.kind),
        Column("Status", lambda k: "revoked" if k.revoked else "active"),
        Column("Created", lambda k: k.created[:19]),
        Column("Last used", lambda k: k.last_used[:19] or "never"),
    ]
