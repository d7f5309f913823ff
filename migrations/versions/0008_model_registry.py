"""The model registry: the models a server may serve, each loaded on demand or pinned
(app/registry/entry.py), and on policies the models a user may use (`models`, a JSON list of
names; NULL: every model in the default row, inherit in a user's).

Existing installs keep today's behaviour: the registry starts empty (the server's --model
flag still names what it serves) and every policy row gets NULL (every model).

Revision ID: 0008_model_registry
Revises: 0007_sealed_jwt_secrets
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_model_registry"
down_revision: str | None = "0007_sealed_jwt_secrets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "registered_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("pinned", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("aliases", sa.JSON(), nullable=False),
        sa.Column("sleep_idle_seconds", sa.Float(), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("hub_repo", sa.String(length=256), nullable=True),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registered_models")),
        sa.UniqueConstraint("name", name=op.f("uq_registered_models_name")),
    )
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("models", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("models")
    op.drop_table("registered_models")
