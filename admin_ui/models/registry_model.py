"""The Models table: one row per registered model (`GET /admin/models`), with its kind, its
planned size, where it stands, what it holds in memory, when it last served, whether it fits
the budget and whether it is pinned."""

from __future__ import annotations

from collections.abc import Sequence

from officellm.admin_ui import format as fmt
from officellm.admin_ui.models.record_table import Column, RecordTableModel
from officellm.admin_ui.registry import ModelRow

NOT_FITTING = "does not fit the budget"


def _size(n: int | None) -> str:
    return "—" if n is None else fmt.size(n)


def _name(m: ModelRow) -> str:
    return m.name + (" (default)" if m.default else "")


def _name_tip(m: ModelRow) -> str:
    lines = [f"source: {m.source or '—'}"]
    if m.hub_repo:
        lines.append(f"Hub repo: {m.hub_repo}")
    if m.aliases:
        lines.append(f"aliases: {', '.join(m.aliases)}")
    return "\n".join(lines)


def _memory(m: ModelRow) -> str:
    """What the plan puts in memory, weights, KV pool and its tiers' RAM; the pool's use
    while it serves."""
    if m.weight_bytes is None and m.kv_cache_bytes is None:
        return "—"
    parts = [f"{_size(m.weight_bytes)} weights"]
    if m.kv_cache_bytes is not None:  # an embedding model has no KV pool
        parts.append(f"{_size(m.kv_cache_bytes)} KV")
    if m.kv_tier_ram_bytes:
        parts.append(f"{_size(m.kv_tier_ram_bytes)} KV tiers in RAM")
    text = " + ".join(parts)
    if m.in_memory and m.kv_cache_usage is not None:
        text += f" ({m.kv_cache_usage:.0%} of KV used, {m.requests_running} running)"
    return text


def _state_tip(m: ModelRow) -> str:
    return m.error or m.state_text


class RegistryModel(RecordTableModel[ModelRow]):
    columns = [
        Column("Name", _name, sort_key=lambda m: m.name, tooltip=_name_tip),
        Column("Kind", lambda m: m.kind),
        Column("Size", lambda m: _size(m.memory_bytes),
               sort_key=lambda m: m.memory_bytes if m.memory_bytes is not None else -1,
               numeric=True),
        Column("State", lambda m: m.state_text, tooltip=_state_tip),
        Column("Memory", _memory, sort_key=lambda m: (m.weight_bytes or 0) + (m.kv_cache_bytes or 0)),
        Column("Last used", lambda m: fmt.ago(m.last_used) or "never",
               sort_key=lambda m: m.last_used or ""),
        Column("Fits", lambda m: "—" if m.fits is None else "fits" if m.fits else NOT_FITTING),
        Column("Pinned", lambda m: "pinned" if m.pinned else ""),
    ]

    def set_records(self, records: Sequence[ModelRow]) -> None:
        """Replace the rows; the same models in the same order change in place, so the view
        keeps its selection and scroll across the refreshes (one a second, from the poller)."""
        records = list(records)
        if [m.name for m in records] != [m.name for m in self.records()] or not records:
            super().set_records(records)
            return
        self._records = records
        self.dataChanged.emit(self.index(0, 0),
                              self.index(len(records) - 1, len(self.columns) - 1))

    def row_of(self, name: str) -> int | None:
        """The row of the model named, or None."""
        return next((i for i, m in enumerate(self.records()) if m.name == name), None)
