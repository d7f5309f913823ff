"""A deleted user's id is never given to another: the prefix-cache salt, the KV disk tier's
owner folder and the events name a person by id, and a newcomer who inherited one would be
reachable under a deleted person's cached context. PostgreSQL's sequences never reuse an id;
SQLite reuses the highest unless the table is AUTOINCREMENT, so its users table is rebuilt so.

Revision ID: 0009_user_ids_never_reused
Revises: 0008_model_registry
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009_user_ids_never_reused"
down_revision: str | None = "0008_model_registry"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rebuild_users(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table("users", recreate="always",
                              table_kwargs={"sqlite_autoincrement": autoincrement}):
        pass


def upgrade() -> None:
    _rebuild_users(True)


def downgrade() -> None:
    _rebuild_users(False)
