"""The Usage table: one row per user, model or day of GET /admin/usage's report."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt

from officellm.admin_ui.models.record_table import Column, RecordTableModel
from officellm.admin_ui.usage_report import UsageRow


def _count(attr: str, header: str, tooltip: str | None = None) -> Column:
    return Column(header, lambda r: f"{getattr(r, attr):,}", sort_key=lambda r: getattr(r, attr),
                  numeric=True, tooltip=(lambda r: tooltip) if tooltip else None)


class UsageModel(RecordTableModel[UsageRow]):
    columns = [
        Column("Name", lambda r: r.name),
        _count("requests", "Requests"),
        _count("prompt_tokens", "Prompt tokens"),
        _count("cached_tokens", "Cached", "Prompt tokens found in the prefix cache"),
        _count("completion_tokens", "Completion tokens"),
        _count("embedding_requests", "Embeddings", "Embedding requests (in Requests too)"),
        _count("task_requests", "Tasks", "Front ends' background tasks: titles, tags, "
                                          "follow-ups (in Requests too)"),
        _count("task_tokens", "Task tokens"),
        _count("images", "Images", "Images in chat requests (their tokens are in Prompt)"),
        _count("audio_requests", "Transcriptions"),
        Column("Audio", lambda r: f"{r.audio_seconds / 60:,.1f} min",
               sort_key=lambda r: r.audio_seconds, numeric=True,
               tooltip=lambda r: "Minutes of audio transcribed or translated"),
        _count("rerank_requests", "Reranks", "Rerank and score requests (in Requests too)"),
        Column("Busy", lambda r: f"{r.busy_seconds:,.1f} s", sort_key=lambda r: r.busy_seconds,
               numeric=True, tooltip=lambda r: "Time the engine spent on these requests"),
    ]

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.key_header = "User"  # the first column names what a row is for

    def set_by(self, by: str) -> None:
        self.key_header = by.capitalize()
        self.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, 0)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 - Qt's name
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if (section, orientation, role) == (0, Qt.Orientation.Horizontal,
                                            Qt.ItemDataRole.DisplayRole):
            return self.key_header
        return super().headerData(section, orientation, role)
