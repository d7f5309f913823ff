"""Threads, install settings, and per-user prefix-cache sharing.

Thread statistics arrived with the "start a new chat" policies (docs/design.md §6); the settings table
holds install-wide switches (transcripts, the admin token's hash); `share_prefix_cache` came
with per-user salting of the prefix cache. Existing installs keep salting on: the default row
gets share_prefix_cache = false, user rows get NULL (inherit).

Revision ID: 0002_threads_and_settings
Revises: 0001_initial
Create Date: 2025-02-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_threads_and_settings"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("thread_key", sa.String(length=80), nullable=False),
        sa.Column("turns", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_prompt_tokens", sa.Integer(), server_default=sa.text("0"),
                  nullable=False),
        sa.Column("last_completion_tokens", sa.Integer(), server_default=sa.text("0"),
                  nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE",
                                name=op.f("fk_threads_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_threads")),
        sa.UniqueConstraint("user_id", "thread_key", name=op.f("uq_threads_user_id_thread_key")),
    )
    op.create_index(op.f("ix_threads_last_seen"), "threads", ["last_seen"])
    op.create_table(
        "settings",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_settings")),
    )
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("share_prefix_cache", sa.Boolean(), nullable=True))
    # A bound false, not `= 0`: PostgreSQL compares no boolean with an integer.
    policies = sa.table("policies", sa.column("user_id", sa.Integer()),
                        sa.column("share_prefix_cache", sa.Boolean()))
    op.execute(policies.update().where(policies.c.user_id.is_(None))
               .values(share_prefix_cache=False))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("share_prefix_cache")
    op.drop_table("settings")
    op.drop_index(op.f("ix_threads_last_seen"), table_name="threads")
    op.drop_table("threads")
