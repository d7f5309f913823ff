"""Recent server events (`GET /admin/events`): preemptions, refusals, the admin's changes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from admin_ui.format import ago
from admin_ui.models.record_table import Column, RecordTableModel


@dataclass
class EventRow:
    time: str
    kind: str
    user: str
    detail: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EventRow:
        detail = d.get("detail")
        if not isinstance(detail, str):
            detail = "" if detail is None else json.dumps(detail, separators=(", ", ": "))
        return cls(time=str(d.get("time") or ""), kind=str(d.get("kind", "")),
                   user=str(d.get("user") or ""), detail=detail)


class EventsModel(RecordTableModel[EventRow]):
    columns = [
        Column("When", lambda e: ago(e.time), sort_key=lambda e: e.time, tooltip=lambda e: e.time),
        Column("Event", lambda e: e.kind.replace("_", " ")),
        Column("User", lambda e: e.user),
        Column("Detail", lambda e: e.detail, tooltip=lambda e: e.detail),
    ]
