"""Alembic migrations on real SQLite files: empty -> head, old data kept, down and up again,
and the ORM models agree with what the migrations build."""

from __future__ import annotations

import sqlite3
from datetime import date
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from officellm.app.db.database import Database
from officellm.app.db.migrate import head_revision
from officellm.app.db.tables import Base
from officellm.app.db.users import create_user, delete_user

ALL_TABLES = {"users", "api_keys", "policies", "threads", "usage", "events", "settings",
              "replicas", "registered_models", "audit_log"}


def _tables(db: Database) -> set[str]:
    return set(inspect(db.engine).get_table_names()) - {"alembic_version"}


def test_upgrade_empty_to_head(db_path: Path) -> None:
    db = Database(db_path)
    assert db.current_revision() is None
    db.upgrade()
    assert db.current_revision() == head_revision() == "0013_audio_minutes"
    assert _tables(db) == ALL_TABLES
    # The default policy row is seeded, with prefix-cache salting on.
    with db.engine.connect() as c:
        rows = c.execute(text("SELECT user_id, on_limit, share_prefix_cache FROM policies")).all()
    assert rows == [(None, "reject", 0)]
    db.upgrade()  # at head already: a no-op, as at every server start
    assert db.current_revision() == head_revision()
    db.close()


def test_connection_pragmas(sqlite_db: Database) -> None:
    with sqlite_db.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


def test_data_written_at_0001_survives_upgrade(db_path: Path) -> None:
    db = Database(db_path)
    db.upgrade("0001_initial")
    assert db.current_revision() == "0001_initial"
    assert "threads" not in _tables(db) and "settings" not in _tables(db)
    db.close()

    # Rows written by an "old officellm", with plain SQL through the stock sqlite3 module.
    con = sqlite3.connect(db_path)
    con.executescript("""
        INSERT INTO users (id, name, disabled, created) VALUES
            (1, 'alice', 0, '2025-01-11 09:00:00.000000'),
            (2, 'bob', 1, '2025-01-12 10:30:00.000000');
        INSERT INTO api_keys (id, user_id, key_hash, prefix, created, last_used, revoked) VALUES
            (1, 1, 'aa' || hex(zeroblob(31)), 'ocl-AAAAAAAA', '2025-01-11 09:01:00.000000',
             '2025-01-20 08:00:00.000000', 0),
            (2, 2, 'bb' || hex(zeroblob(31)), 'ocl-BBBBBBBB', '2025-01-12 10:31:00.000000',
             NULL, 1);
        UPDATE policies SET max_context_tokens = 8192, on_limit = 'notify' WHERE user_id IS NULL;
        INSERT INTO policies (user_id, max_turns, max_tokens_per_day) VALUES (1, 40, 100000);
        INSERT INTO usage (user_id, day, requests, prompt_tokens, completion_tokens) VALUES
            (1, '2025-01-20', 12, 3400, 1200), (2, '2025-01-20', 3, 100, 50);
        INSERT INTO events (time, kind, user_id, detail) VALUES
            ('2025-01-20 08:00:01.000000', 'refused', 1, '{"reason": "max_turns"}');
    """)
    con.commit()
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
              for t in ("users", "api_keys", "policies", "usage", "events")}
    con.close()

    db = Database(db_path)
    db.upgrade()
    assert db.current_revision() == head_revision()
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT * FROM events ORDER BY 1, 2").fetchall() == before["events"]
    # usage gained 0011's model (its key: '' for rows from before) and counters (zeros).
    assert con.execute("SELECT user_id, day, requests, prompt_tokens, completion_tokens "
                       "FROM usage ORDER BY 1, 2").fetchall() == before["usage"]
    assert con.execute("SELECT DISTINCT model, cached_tokens, embedding_requests, task_tokens, "
                       "busy_seconds FROM usage").fetchall() == [("", 0, 0, 0, 0)]
    # users and api_keys gained 0003's columns at the end (api_keys 0007's too), each empty
    # or false.
    for table, added in (("users", (None, None)), ("api_keys", (0, None, None))):
        after_rows = con.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        assert [row[:-len(added)] for row in after_rows] == before[table]
        assert {row[-len(added):] for row in after_rows} == {added}
    # policies gained share_prefix_cache (0002), priority and max_kv_share (0004), models
    # (0008), audio_minutes_per_day (0013): the default row's are false, 'normal', NULL (no
    # cap), NULL (every model) and NULL (no limit); users' rows NULL (inherit).
    after = con.execute("SELECT * FROM policies ORDER BY 1, 2").fetchall()
    assert [row[:-5] for row in after] == before["policies"]
    assert [row[-5:] for row in after] == [(0, "normal", None, None, None),
                                           (None, None, None, None, None)]
    assert con.execute("SELECT count(*) FROM threads").fetchone() == (0,)
    con.close()

    # And the ORM reads the upgraded rows correctly.
    from officellm.app.db.policies import get_effective_policy
    from officellm.app.db.users import list_users

    with db.session() as s:
        assert [(u.name, u.disabled) for u in list_users(s)] == [("alice", False), ("bob", True)]
        eff = get_effective_policy(s, "alice")
    assert (eff.max_context_tokens, eff.max_turns, eff.on_limit, eff.max_tokens_per_day,
            eff.share_prefix_cache, eff.priority, eff.max_kv_share) == \
        (8192, 40, "notify", 100000, False, "normal", None)
    assert db.integrity_check() == "ok"
    db.close()


def test_data_written_at_0002_survives_0003(db_path: Path) -> None:
    """0003 (front-end keys) adds columns to users and api_keys, rebuilding both tables: every
    row, and the rows of the tables that point at them, comes through unchanged."""
    db = Database(db_path)
    db.upgrade("0002_threads_and_settings")
    db.close()
    con = sqlite3.connect(db_path)
    con.executescript("""
        INSERT INTO users (id, name, disabled, created) VALUES
            (1, 'alice', 0, '2025-02-11 09:00:00.000000'),
            (2, 'bob', 1, '2025-02-12 10:30:00.000000');
        INSERT INTO api_keys (id, user_id, key_hash, prefix, created, last_used, revoked) VALUES
            (1, 1, 'aa' || hex(zeroblob(31)), 'ocl-AAAAAAAA', '2025-02-11 09:01:00.000000',
             '2025-02-20 08:00:00.000000', 0),
            (2, 2, 'bb' || hex(zeroblob(31)), 'ocl-BBBBBBBB', '2025-02-12 10:31:00.000000',
             NULL, 1);
        INSERT INTO policies (user_id, max_turns, share_prefix_cache) VALUES (1, 40, 1);
        INSERT INTO threads (user_id, thread_key, turns, last_prompt_tokens,
                             last_completion_tokens, first_seen, last_seen) VALUES
            (1, 'h:abc', 3, 900, 120, '2025-02-20 08:00:00.000000',
             '2025-02-20 08:05:00.000000');
        INSERT INTO usage (user_id, day, requests, prompt_tokens, completion_tokens) VALUES
            (1, '2025-02-20', 12, 3400, 1200);
        INSERT INTO settings (key, value) VALUES ('admin_token_hash', 'ff');
    """)
    con.commit()
    tables = ("users", "api_keys", "policies", "threads", "usage", "settings")
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables}
    con.close()

    db = Database(db_path)
    db.upgrade("0003_front_end_keys")
    con = sqlite3.connect(db_path)
    after = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables}
    con.close()
    for t in ("policies", "threads", "usage", "settings"):
        assert after[t] == before[t]
    # The new columns come last: every old user is nobody's forwarded person, every old key
    # an ordinary key without a secret.
    assert [row[:-2] for row in after["users"]] == before["users"]
    assert [row[-2:] for row in after["users"]] == [(None, None), (None, None)]
    assert [row[:-2] for row in after["api_keys"]] == before["api_keys"]
    assert [row[-2:] for row in after["api_keys"]] == [(0, None), (0, None)]

    from officellm.app.db.keys import list_keys
    from officellm.app.db.users import list_users

    db.upgrade()  # the ORM reads the newest schema
    with db.session() as s:
        assert [(u.name, u.via) for u in list_users(s)] == [("alice", None), ("bob", None)]
        assert [(k.prefix, k.forwarded_users, k.jwt_secret) for k in list_keys(s)] == [
            ("ocl-AAAAAAAA", False, False), ("ocl-BBBBBBBB", False, False)]
    assert db.integrity_check() == "ok"
    with db.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA foreign_key_check").all() == []

    # And back down to 0002: the rows stay, the columns go.
    db.downgrade("0002_threads_and_settings")
    con = sqlite3.connect(db_path)
    assert {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables} == before
    con.close()
    db.close()


def test_downgrade_to_base_and_up_again(db: Database) -> None:


    with db.transaction() as s:
        create_user(s, "carol")
    db.downgrade("0001_initial")
    assert "threads" not in _tables(db)
    with db.engine.connect() as c:  # the batch rebuild of policies kept users' rows
        assert c.execute(text("SELECT name FROM users")).scalars().all() == ["carol"]
        assert "share_prefix_cache" not in {
            col["name"] for col in inspect(c).get_columns("policies")}
    db.downgrade("base")
    assert db.current_revision() is None
    assert _tables(db) == set()
    db.upgrade()
    assert _tables(db) == ALL_TABLES


def _diffs(db: Database) -> list:
    with db.engine.connect() as c:
        ctx = MigrationContext.configure(
            c, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(ctx, Base.metadata)


def test_models_match_migrated_schema(db: Database) -> None:
    assert _diffs(db) == []


def test_schema_comparison_notices_a_difference(db: Database) -> None:
    # The comparison above must be able to fail: remove an index and it is reported.
    with db.engine.begin() as c:
        c.execute(text("DROP INDEX ix_api_keys_prefix"))
    diffs = _diffs(db)
    assert any(d[0] == "add_index" and d[1].name == "ix_api_keys_prefix" for d in diffs)


def test_0004_scheduling_adds_priority_and_kv_share_and_downgrades_cleanly(db_path: Path) -> None:
    from officellm.app.db.policies import get_effective_policy, set_policy


    db = Database(db_path)
    db.upgrade("0003_front_end_keys")
    with db.transaction() as s:
        create_user(s, "dave")
    with db.engine.begin() as c:
        c.execute(text("INSERT INTO policies (user_id, max_turns) VALUES (1, 12)"))
    db.upgrade("0004_scheduling")
    with db.engine.connect() as c:
        assert c.execute(text("SELECT user_id, priority, max_kv_share FROM policies "
                              "ORDER BY id")).all() == [(None, "normal", None), (1, None, None)]
    db.upgrade()  # the ORM reads the newest schema
    with db.transaction() as s:
        eff = get_effective_policy(s, "dave")
        assert (eff.max_turns, eff.priority, eff.max_kv_share) == (12, "normal", None)
        set_policy(s, "dave", priority="low", max_kv_share=0.3)
    db.downgrade("0003_front_end_keys")
    with db.engine.connect() as c:
        columns = {col["name"] for col in inspect(c).get_columns("policies")}
        assert not {"priority", "max_kv_share"} & columns
        assert c.execute(text("SELECT max_turns FROM policies WHERE user_id = 1")).scalar() == 12
    db.close()


def test_data_written_at_0007_survives_0008_and_the_registry_starts_empty(db_path: Path) -> None:
    """0008 (the model registry) adds a table and rebuilds policies to add `models`: every
    user, key, policy and usage row comes through, each policy allowing every model."""
    db = Database(db_path)
    db.upgrade("0007_sealed_jwt_secrets")
    db.close()
    con = sqlite3.connect(db_path)
    con.executescript("""
        INSERT INTO users (id, name, disabled, created) VALUES
            (1, 'alice', 0, '2026-12-01 09:00:00.000000'),
            (2, 'bob', 1, '2026-12-02 10:30:00.000000');
        INSERT INTO api_keys (id, user_id, key_hash, prefix, created, last_used, revoked,
                              forwarded_users) VALUES
            (1, 1, 'aa' || hex(zeroblob(31)), 'ocl-AAAAAAAA', '2026-12-01 09:01:00.000000',
             '2026-12-03 08:00:00.000000', 0, 0),
            (2, 2, 'bb' || hex(zeroblob(31)), 'ocl-BBBBBBBB', '2026-12-02 10:31:00.000000',
             NULL, 1, 0);
        UPDATE policies SET max_turns = 30, priority = 'high' WHERE user_id IS NULL;
        INSERT INTO policies (user_id, max_tokens_per_day, max_kv_share) VALUES (1, 50000, 0.25);
        INSERT INTO usage (user_id, day, requests, prompt_tokens, completion_tokens) VALUES
            (1, '2026-12-03', 7, 2100, 800), (2, '2026-12-03', 1, 10, 5);
    """)
    con.commit()
    tables = ("users", "api_keys", "usage")
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}
    before_policies = con.execute("SELECT * FROM policies ORDER BY 1").fetchall()
    con.close()

    db = Database(db_path)
    db.upgrade("0008_model_registry")
    assert db.current_revision() == "0008_model_registry"
    con = sqlite3.connect(db_path)
    for t in tables:
        assert con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() == before[t]
    after_policies = con.execute("SELECT * FROM policies ORDER BY 1").fetchall()
    assert [row[:-1] for row in after_policies] == before_policies
    assert [row[-1] for row in after_policies] == [None, None]  # every model
    assert con.execute("SELECT count(*) FROM registered_models").fetchone() == (0,)
    con.close()
    assert db.integrity_check() == "ok"
    with db.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA foreign_key_check").all() == []

    # And back down to 0007: the registry goes, the policies keep their rows.
    db.downgrade("0007_sealed_jwt_secrets")
    assert "registered_models" not in _tables(db)
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT * FROM policies ORDER BY 1").fetchall() == before_policies
    con.close()
    db.close()


def test_0009_keeps_every_user_and_never_gives_a_deleted_users_id_again(db_path: Path) -> None:
    """0009 rebuilds SQLite's users table AUTOINCREMENT: the rows come through, and the id of
    the newest user, deleted, is not the next one's (it names their prefix-cache salt)."""
    db = Database(db_path)
    db.upgrade("0008_model_registry")
    db.close()
    con = sqlite3.connect(db_path)
    con.executescript("""
        INSERT INTO users (id, name, disabled, created) VALUES
            (1, 'alice', 0, '2026-12-01 09:00:00.000000'),
            (2, 'bob', 1, '2026-12-02 10:30:00.000000');
        INSERT INTO usage (user_id, day, requests, prompt_tokens, completion_tokens) VALUES
            (2, '2026-12-03', 1, 10, 5);
    """)
    con.commit()
    before = con.execute("SELECT * FROM users ORDER BY id").fetchall()
    con.close()
    db = Database(db_path)
    db.upgrade()
    with db.transaction() as session:
        delete_user(session, "bob")
        assert create_user(session, "carol").id == 3
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT * FROM users WHERE id = 1").fetchall() == before[:1]
    assert con.execute("SELECT count(*) FROM usage").fetchone() == (0,)  # bob's went with him
    con.close()
    assert db.integrity_check() == "ok"
    db.downgrade("0008_model_registry")
    assert db.current_revision() == "0008_model_registry"
    db.close()


def test_0011_keeps_each_days_usage_under_no_model_and_keys_rows_by_model(
        db_target: Path | str) -> None:
    """0011 adds the model to the usage key: a day counted before keeps its numbers under the
    model '' with the new counters zero; a new row for the same user and day under a model
    sits beside it; down again, the day's rows are summed back into one."""
    from officellm.app.db.records import UsageCounts
    from officellm.app.db.usage import add_usage, usage_on

    db = Database(db_target)
    db.upgrade("0010_audit_log")
    with db.engine.begin() as c:
        c.execute(text("INSERT INTO users (id, name, disabled, created) VALUES "
                       "(1, 'alice', false, '2026-12-01 09:00:00')"))
        c.execute(text("INSERT INTO usage (user_id, day, requests, prompt_tokens, "
                       "completion_tokens) VALUES (1, '2026-12-03', 7, 2100, 800)"))
    db.upgrade()
    day = date(2026, 12, 3)
    with db.engine.connect() as c:
        rows = c.execute(text("SELECT model, requests, prompt_tokens, completion_tokens, "
                              "cached_tokens, embedding_requests, embedding_tokens, "
                              "task_requests, task_tokens, busy_seconds FROM usage")).all()
    assert [tuple(r) for r in rows] == [("", 7, 2100, 800, 0, 0, 0, 0, 0, 0)]
    with db.transaction() as s:
        add_usage(s, 1, day, "smollm2", UsageCounts(requests=1, prompt_tokens=10,
                                                    completion_tokens=5))
    with db.session() as s:
        assert usage_on(s, 1, day).total_tokens == 2900 + 15  # the quota sums every model
    db.downgrade("0010_audit_log")
    with db.engine.connect() as c:
        assert [tuple(r) for r in c.execute(text(
            "SELECT user_id, requests, prompt_tokens, completion_tokens FROM usage"))] == [
            (1, 8, 2110, 805)]
        assert "model" not in {col["name"] for col in inspect(c).get_columns("usage")}
    db.close()
