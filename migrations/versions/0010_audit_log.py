"""The audit log: every admin change (users, keys, policies, models) with who made it, what
it changed, the values before and after, and when (app/db/audit.py). Append-only from the
server's side; never a key, token, password or hash in it, and no message content.

Revision ID: 0010_audit_log
Revises: 0009_user_ids_never_reused
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_audit_log"
down_revision: str | None = "0009_user_ids_never_reused"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_time"), "audit_log", ["time"])


def downgrade() -> None:
    op.drop_index(op.f("ix_audit_log_time"), table_name="audit_log")
    op.drop_table("audit_log")
