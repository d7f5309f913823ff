"""Recent server events (`GET /admin/events`): preemptions, refusals, the admin's changes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from officellm.admin_ui.format import ago
from officellm.admin_ui.models.record_table import Column, RecordTableModel


@dataclass
class EventRow:
    time: str
    kind: str
    user: str
    detail: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EventRow:
        detail = d.get("detail")
        if isinstance(detail, dict):
            # "reason: max_context_tokens, tokens: 9,120, limit: 8,192" reads better than JSON.
            detail = ", ".join(f"{k.replace('_', ' ')}: {_value(v)}" for k, v in detail.items())
        elif not isinstance(detail, str):
            detail = "" if detail is None else json.dumps(detail)
        return cls(time=str(d.get("time") or ""), kind=str(d.get("kind", "")),
                   user=str(d.get("user") or ""), detail=detail)


def _value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:.2f}"


class EventsModel(RecordTableModel[EventRow]):
    columns = [
        Column("When", lambda e: ago(e.time), sort_key=lambda e: e.time, tooltip=lambda e: e.time),
        Column("Event", lambda e: e.kind.replace("_", " ")),
        Column("User", lambda e: e.user),
        Column("Detail", lambda e: e.detail, tooltip=lambda e: e.detail),
    ]
