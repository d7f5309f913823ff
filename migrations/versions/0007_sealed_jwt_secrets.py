"""Front-end keys' JWT secrets sealed in the database (app/db/jwt_secrets.py), so that every
replica sharing it can check a key's JWTs. The secrets of keys issued before stay in their
files until the server's next start seals them in (adopt_legacy_files): a migration cannot,
since the install key they are sealed under is a file of the server's.

Revision ID: 0007_sealed_jwt_secrets
Revises: 0006_replicas
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_sealed_jwt_secrets"
down_revision: str | None = "0006_replicas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("jwt_secret_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("jwt_secret_sealed")
