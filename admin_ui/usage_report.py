"""GET /admin/usage's answer as the console reads it (docs/admin_api.md): one row per user,
model or day, and the total. Plain records, read defensively: a missing number reads 0."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BY_CHOICES = ("user", "model", "day")
UNKNOWN_MODEL = "(unknown)"  # usage counted before rows named their model (migration 0011)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


@dataclass(frozen=True)
class UsageRow:
    """One group's counters; `name` is the user, the model or the day it is for."""

    name: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    embedding_requests: int = 0
    embedding_tokens: int = 0
    task_requests: int = 0
    task_tokens: int = 0
    busy_seconds: float = 0.0
    images: int = 0
    audio_requests: int = 0
    audio_seconds: float = 0.0
    rerank_requests: int = 0
    rerank_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_json(cls, row: dict[str, Any], by: str) -> UsageRow:
        name = row.get(by)
        if by == "model" and not name:
            name = UNKNOWN_MODEL
        busy, audio = row.get("busy_seconds"), row.get("audio_seconds")
        return cls(name=str(name or ""), requests=_int(row.get("requests")),
                   prompt_tokens=_int(row.get("prompt_tokens")),
                   cached_tokens=_int(row.get("cached_tokens")),
                   completion_tokens=_int(row.get("completion_tokens")),
                   embedding_requests=_int(row.get("embedding_requests")),
                   embedding_tokens=_int(row.get("embedding_tokens")),
                   task_requests=_int(row.get("task_requests")),
                   task_tokens=_int(row.get("task_tokens")),
                   busy_seconds=float(busy) if isinstance(busy, (int, float)) else 0.0,
                   images=_int(row.get("images")), audio_requests=_int(row.get("audio_requests")),
                   audio_seconds=float(audio) if isinstance(audio, (int, float)) else 0.0,
                   rerank_requests=_int(row.get("rerank_requests")),
                   rerank_tokens=_int(row.get("rerank_tokens")))


@dataclass(frozen=True)
class UsageReport:
    since: str = ""
    until: str = ""
    by: str = "user"
    rows: list[UsageRow] = field(default_factory=list)
    total: UsageRow = field(default_factory=lambda: UsageRow("Total"))

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> UsageReport:
        by = str(body.get("by") or "user")
        rows = body.get("rows") if isinstance(body.get("rows"), list) else []
        total = body.get("total") if isinstance(body.get("total"), dict) else {}
        return cls(since=str(body.get("since") or ""), until=str(body.get("until") or ""), by=by,
                   rows=[UsageRow.from_json(r, by) for r in rows if isinstance(r, dict)],
                   total=UsageRow.from_json({**total, by: "Total"}, by))
