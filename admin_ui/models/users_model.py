"""The users table: name, status and today's usage (`GET /admin/users`). A person a front end
speaks for reads "alice@example.com via open-webui"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from officellm.admin_ui.models.record_table import Column, RecordTableModel


@dataclass
class UserRow:
    id: int
    name: str
    disabled: bool
    created: str
    requests_today: int
    prompt_tokens_today: int
    completion_tokens_today: int
    via: str | None = None  # the front end this person came through

    @property
    def label(self) -> str:
        return f"{self.name} via {self.via}" if self.via else self.name

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UserRow:
        u = d.get("usage_today") or {}
        return cls(id=int(d.get("id") or 0), name=str(d.get("name", "")),
                   disabled=bool(d.get("disabled")), created=str(d.get("created") or ""),
                   requests_today=int(u.get("requests") or 0),
                   prompt_tokens_today=int(u.get("prompt_tokens") or 0),
                   completion_tokens_today=int(u.get("completion_tokens") or 0),
                   via=str(d["via"]) if d.get("via") else None)


class UsersModel(RecordTableModel[UserRow]):
    columns = [
        Column("User", lambda u: u.label, sort_key=lambda u: u.name),
        Column("Status", lambda u: "disabled" if u.disabled else "active"),
        Column("Requests today", lambda u: f"{u.requests_today:,}",
               sort_key=lambda u: u.requests_today, numeric=True),
        Column("Prompt tokens today", lambda u: f"{u.prompt_tokens_today:,}",
               sort_key=lambda u: u.prompt_tokens_today, numeric=True),
        Column("Completion tokens today", lambda u: f"{u.completion_tokens_today:,}",
               sort_key=lambda u: u.completion_tokens_today, numeric=True),
        Column("Created", lambda u: u.created[:19]),
    ]
