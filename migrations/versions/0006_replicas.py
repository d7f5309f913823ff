"""The replicas sharing this database (docs/cluster.md): each server registers itself at
start and writes a heartbeat every few seconds, so the admin API and the console can list
them and tell a live one from a stopped one. A single server is a one-row table.

Revision ID: 0006_replicas
Revises: 0005_wide_counters
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_replicas"
down_revision: str | None = "0005_wide_counters"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("started", sa.DateTime(), nullable=False),
        sa.Column("heartbeat", sa.DateTime(), nullable=False),
        sa.Column("draining", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_replicas")),
    )


def downgrade() -> None:
    op.drop_table("replicas")
