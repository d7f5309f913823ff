"""The ORM schema: users, api_keys, policies, threads, usage, events, settings, replicas,
registered_models, audit_log.

This is the *current* schema; its history lives in migrations/versions/, and a test checks
that the two agree (Alembic autogenerate finds no differences).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from officellm.app.db.column_types import UtcDateTime, utcnow

# Named constraints: SQLite batch migrations (copy-and-move) can only recreate or drop
# constraints that have names.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ON_LIMIT_CHOICES = ("reject", "notify", "truncate")
# The longest served model name a usage row keeps (longer ones are cut to it).
MODEL_NAME_LENGTH = 256


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class User(Base):
    """A person (or a front end's own account). A person a front end speaks for has
    `via_user_id`, the front end's user, and `forwarded_id`, the SHA-256 of the front end's
    stable id for them (docs/design.md §5): found again by that pair, whatever their name."""

    __tablename__ = "users"
    # AUTOINCREMENT on SQLite: a deleted user's id is never given to another (it names their
    # prefix-cache salt; migrations/versions/0009).
    __table_args__ = (UniqueConstraint("via_user_id", "forwarded_id"),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    # SET NULL, not CASCADE: the people's usage and threads outlive their front end's account.
    via_user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), index=True)
    forwarded_id: Mapped[str | None] = mapped_column(String(64))
    via: Mapped[User | None] = relationship(remote_side=[id])


class ApiKey(Base):
    """A user's API key; only its SHA-256 is stored (see app/db/keys.py for why that suffices)."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the raw key, so an admin can tell keys apart without the secret.
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_used: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A front-end key speaks for other people (docs/design.md §5).
    forwarded_users: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Its JWT secret's scrypt fingerprint, and the secret sealed under the install key, a
    # file of the server's: never in clear (app/db/jwt_secrets.py, docs/security.md).
    jwt_secret_hash: Mapped[str | None] = mapped_column(String(160))
    jwt_secret_sealed: Mapped[str | None] = mapped_column(Text)


class Policy(Base):
    """The default policy (user_id NULL) or one user's override (NULL fields inherit)."""

    __tablename__ = "policies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Unique: one override per user. SQLite lets several NULLs through a UNIQUE constraint, so
    # the single default row is guaranteed by the code: the migration seeds it, nothing inserts one.
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), unique=True)
    max_context_tokens: Mapped[int | None] = mapped_column(BigInteger)
    max_turns: Mapped[int | None] = mapped_column(BigInteger)
    on_limit: Mapped[str | None] = mapped_column(String(16))
    max_concurrent_requests: Mapped[int | None] = mapped_column(BigInteger)
    max_tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    # Minutes of audio a day the speech-to-text routes may read for the user (migration 0013).
    audio_minutes_per_day: Mapped[int | None] = mapped_column(BigInteger)
    share_prefix_cache: Mapped[bool | None] = mapped_column(Boolean)
    # The fair scheduler's weight (app/policy/scheduling.py) and KV share cap (0-1].
    priority: Mapped[str | None] = mapped_column(String(8))
    max_kv_share: Mapped[float | None] = mapped_column(Float)
    # The registered models' names the user may use (a JSON list); NULL: every model in the
    # default row, inherit in a user's.
    models: Mapped[list[str] | None] = mapped_column(JSON)


class Thread(Base):
    """Per-conversation statistics; message content is never stored here."""

    __tablename__ = "threads"
    __table_args__ = (UniqueConstraint("user_id", "thread_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    thread_key: Mapped[str] = mapped_column(String(80))
    turns: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    last_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    last_completion_tokens: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default=text("0"))
    first_seen: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class Usage(Base):
    """Per user per model per UTC day: requests, tokens and engine time (never a word of what
    was asked or answered). max_tokens_per_day sums a person's rows over every model.

    `requests`, `prompt_tokens` and `completion_tokens` are totals: embeddings and front ends'
    background tasks are in them, and are also counted apart in `embedding_*` and `task_*`.
    `model` is the served model's name; '' on rows from before migrations/versions/0011,
    which did not know it."""

    __tablename__ = "usage"

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH), primary_key=True,
                                       server_default=text("''"))
    requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    # Of prompt_tokens, those the engine found in its prefix cache (computed once before).
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    embedding_requests: Mapped[int] = mapped_column(BigInteger, default=0,
                                                    server_default=text("0"))
    embedding_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    task_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    task_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    # Seconds from the engine taking each request to its last output (docs/admin_api.md).
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    # Issue 58's inputs (migrations/versions/0012): images in chats (their tokens are in
    # prompt_tokens), transcriptions with their audio's seconds, rerankings with their tokens.
    images: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    audio_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    audio_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    rerank_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    rerank_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class Event(Base):
    """Something the admin should see later: a refusal, a preemption, a key revoked."""

    __tablename__ = "events"
    __table_args__ = (Index(None, "user_id", "time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    detail: Mapped[Any | None] = mapped_column(JSON)


class Setting(Base):
    """Install-wide key/value settings (the admin token's hash, ...)."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Replica(Base):
    """A server sharing this database (docs/cluster.md): where it answers, what it serves,
    and when it last said it was alive."""

    __tablename__ = "replicas"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))
    model: Mapped[str | None] = mapped_column(String(256))
    started: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    heartbeat: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class RegisteredModel(Base):
    """A model the server may serve (app/registry/entry.py's ModelEntry is its value form):
    loaded on demand, or at start when pinned."""

    __tablename__ = "registered_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    source: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    aliases: Mapped[list[str]] = mapped_column(JSON, default=list)
    sleep_idle_seconds: Mapped[float | None] = mapped_column(Float)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    hub_repo: Mapped[str | None] = mapped_column(String(256))
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class AuditEntryRow(Base):
    """One admin change (app/db/audit.py): who, what, to what, before and after. Rows are
    only ever added: nothing in the server updates or deletes them, and no foreign key ties
    them to a user, so deleting a person keeps the record of who deleted them."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    before: Mapped[Any | None] = mapped_column(JSON)
    after: Mapped[Any | None] = mapped_column(JSON)
