"""The Replicas tab's people table: each person's hold on the picked view's KV pool, and the
replica they are on."""

from __future__ import annotations

from officellm.admin_ui.models.record_table import Column, RecordTableModel
from officellm.admin_ui.replicas import PersonShare


class PeopleModel(RecordTableModel[PersonShare]):
    columns = [
        Column("Person", lambda p: p.user),
        Column("Replica", lambda p: ", ".join(p.replicas)),
        Column("KV blocks", lambda p: f"{p.kv_blocks:,}", sort_key=lambda p: p.kv_blocks,
               numeric=True),
        Column("Share of pool", lambda p: f"{p.kv_share:.1%}", sort_key=lambda p: p.kv_share,
               numeric=True),
        Column("Running", lambda p: str(p.running), sort_key=lambda p: p.running, numeric=True),
        Column("Preemptions", lambda p: str(p.preemptions_total),
               sort_key=lambda p: p.preemptions_total, numeric=True),
    ]
