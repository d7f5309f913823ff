"""Per-user scheduling: priority and max_kv_share on policies (docs/design.md §2, §6).

`priority` (low / normal / high) is the user's weight under the fair scheduling policy;
`max_kv_share` (a fraction of the KV pool, NULL = no cap) the share above which their prompts
wait while others have work. Existing installs keep today's behaviour: the default row gets
priority 'normal' and no cap, user rows NULL (inherit).

Self-contained: it only adds two columns to policies and seeds the default row, so it can be
chained after 0003_front_end_keys without change.

Revision ID: 0004_scheduling
Revises: 0003_front_end_keys
Create Date: 2025-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_scheduling"
down_revision: str | None = "0003_front_end_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("priority", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("max_kv_share", sa.Float(), nullable=True))
    op.execute("UPDATE policies SET priority = 'normal' WHERE user_id IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("max_kv_share")
        batch.drop_column("priority")
