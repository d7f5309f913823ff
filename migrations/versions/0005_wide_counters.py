"""64-bit limits and counters: a policy's limits take up to 2**63 - 1 (app/policy), and a
busy office's daily token counts and a long thread's token counts outgrow 32 bits in
PostgreSQL, whose INTEGER is 32-bit (SQLite's INTEGER was always 64-bit: there this changes
the declared type only, and no value).

Revision ID: 0005_wide_counters
Revises: 0004_scheduling
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_wide_counters"
down_revision: str | None = "0004_scheduling"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WIDE = {
    "policies": ("max_context_tokens", "max_turns", "max_concurrent_requests",
                 "max_tokens_per_day"),
    "usage": ("requests", "prompt_tokens", "completion_tokens"),
    "threads": ("turns", "last_prompt_tokens", "last_completion_tokens"),
}


def _retype(to: sa.types.TypeEngine, was: sa.types.TypeEngine) -> None:
    for table, columns in WIDE.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(column, type_=to, existing_type=was)


def upgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())


def downgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())
