"""Front-end keys and the people they speak for.

A front-end key (Open WebUI, LibreChat, a proxy) is trusted to say which person a request is
for (docs/design.md §5): `api_keys.forwarded_users`, and `api_keys.jwt_secret_hash`, the scrypt
fingerprint of the HS256 secret its JWTs are checked with (the secret itself is in a private
file beside the database, never here). A person it speaks for is a user row linked to the
front end's user (`users.via_user_id`) and found again by `users.forwarded_id`, the SHA-256 of
the front end's stable id for them. Existing keys become ordinary keys, existing users are
nobody's forwarded people: nothing about them changes.

Revision ID: 0003_front_end_keys
Revises: 0002_threads_and_settings
Create Date: 2025-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_front_end_keys"
down_revision: str | None = "0002_threads_and_settings"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("forwarded_users", sa.Boolean(), server_default=sa.false(),
                                   nullable=False))
        batch.add_column(sa.Column("jwt_secret_hash", sa.String(length=160), nullable=True))
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("via_user_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("forwarded_id", sa.String(length=64), nullable=True))
        batch.create_foreign_key(op.f("fk_users_via_user_id_users"), "users", ["via_user_id"],
                                 ["id"], ondelete="SET NULL")
        batch.create_index(op.f("ix_users_via_user_id"), ["via_user_id"])
        batch.create_unique_constraint(op.f("uq_users_via_user_id_forwarded_id"),
                                       ["via_user_id", "forwarded_id"])


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_constraint(op.f("uq_users_via_user_id_forwarded_id"), type_="unique")
        batch.drop_index(op.f("ix_users_via_user_id"))
        batch.drop_constraint(op.f("fk_users_via_user_id_users"), type_="foreignkey")
        batch.drop_column("forwarded_id")
        batch.drop_column("via_user_id")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("jwt_secret_hash")
        batch.drop_column("forwarded_users")
