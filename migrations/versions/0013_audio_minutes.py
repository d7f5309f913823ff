"""A policy's minutes of audio a day (audio_minutes_per_day): what /v1/audio/transcriptions and
/v1/audio/translations may read for a person per UTC day; NULL: no limit (default row) or
inherit (a user's).

Revision ID: 0013_audio_minutes
Revises: 0012_office_inputs_usage
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_audio_minutes"
down_revision: str | None = "0012_office_inputs_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("audio_minutes_per_day", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("audio_minutes_per_day")
