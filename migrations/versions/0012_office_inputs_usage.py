"""Usage of issue 58's inputs: images in chats, transcriptions with their audio's seconds, and
rerankings with their tokens, each counted apart (their requests and tokens are in the totals
too, as embeddings' are).

Revision ID: 0012_office_inputs_usage
Revises: 0011_usage_by_model
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_office_inputs_usage"
down_revision: str | None = "0011_usage_by_model"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = ("images", "audio_requests", "rerank_requests", "rerank_tokens")


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        for name in COUNTERS:
            batch.add_column(sa.Column(name, sa.BigInteger(), server_default=sa.text("0"),
                                       nullable=False))
        batch.add_column(sa.Column("audio_seconds", sa.Float(), server_default=sa.text("0"),
                                   nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        for name in (*COUNTERS, "audio_seconds"):
            batch.drop_column(name)
