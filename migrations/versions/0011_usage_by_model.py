"""Usage per model, with the numbers an office's report asks for: the usage row's key gains
the served model's name, and the row gains the prompt tokens the prefix cache held, the
embedding and background-task requests and tokens counted apart, and the engine's busy time.

Rows written before this revision did not know their model: they keep their counts under
the model '' (the reports show it as "(unknown)"). Downgrading sums each user's day over
its models back into one row, and drops the new counters.

Revision ID: 0011_usage_by_model
Revises: 0010_audit_log
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_usage_by_model"
down_revision: str | None = "0010_audit_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = ("cached_tokens", "embedding_requests", "embedding_tokens", "task_requests",
            "task_tokens")
OLD_COUNTERS = ("requests", "prompt_tokens", "completion_tokens")


def upgrade() -> None:
    # SQLite cannot change a primary key in place: the batch rebuilds the table (copy and
    # move); PostgreSQL alters it.
    with op.batch_alter_table("usage", recreate="always") as batch:
        batch.add_column(sa.Column("model", sa.String(256), server_default=sa.text("''"),
                                   nullable=False))
        for name in COUNTERS:
            batch.add_column(sa.Column(name, sa.BigInteger(), server_default=sa.text("0"),
                                       nullable=False))
        batch.add_column(sa.Column("busy_seconds", sa.Float(), server_default=sa.text("0"),
                                   nullable=False))
        batch.drop_constraint("pk_usage", type_="primary")
        batch.create_primary_key("pk_usage", ["user_id", "day", "model"])


def downgrade() -> None:
    # One row per user and day again: fold the models' rows into the one under ''.
    bind = op.get_bind()
    sums = ", ".join(f"sum({c}) AS {c}" for c in OLD_COUNTERS)
    rows = bind.execute(sa.text(
        f"SELECT user_id, day, {sums} FROM usage GROUP BY user_id, day")).mappings().all()
    bind.execute(sa.text("DELETE FROM usage"))
    if rows:
        kept = ("user_id", "day", *OLD_COUNTERS)
        bind.execute(sa.text(f"INSERT INTO usage (model, {', '.join(kept)}) "
                             f"VALUES ('', {', '.join(':' + c for c in kept)})"),
                     [dict(r) for r in rows])
    with op.batch_alter_table("usage", recreate="always") as batch:
        batch.drop_constraint("pk_usage", type_="primary")
        batch.create_primary_key("pk_usage", ["user_id", "day"])
        for name in (*COUNTERS, "busy_seconds", "model"):
            batch.drop_column(name)
