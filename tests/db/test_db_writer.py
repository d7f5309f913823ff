"""UsageWriter: batched writes, exact counts, nothing lost on close, survives SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from officellm.app.accounts.usage_writer import UsageWriter
from officellm.app.db.database import Database
from officellm.app.db.events import recent_events
from officellm.app.db.keys import issue_key, list_keys
from officellm.app.db.policies import get_policy, set_policy
from officellm.app.db.threads import get_thread_state, list_threads
from officellm.app.db.usage import list_usage, usage_today
from officellm.app.db.users import create_user, get_user

ROOT = Path(__file__).resolve().parents[2]


def _two_users(db: Database) -> tuple[int, int]:
    with db.transaction() as s:
        a = create_user(s, "alice")
        b = create_user(s, "bob")
        issue_key(s, "alice")
        issue_key(s, "bob")
    return a.id, b.id


@pytest.fixture
def users(db: Database) -> tuple[int, int]:
    return _two_users(db)


def test_many_updates_from_many_threads_are_counted_exactly(db: Database, users) -> None:
    alice, bob = users
    writer = UsageWriter(db, interval=0.01)

    def traffic(uid: int, n: int) -> None:
        for i in range(n):
            writer.add_usage(uid, prompt_tokens=7, completion_tokens=3)
            writer.record_thread(uid, f"h:{uid}", turns=i + 1, prompt_tokens=i, completion_tokens=1)
            writer.touch_key(1 if uid == alice else 2)
            if i % 50 == 0:
                writer.record_event("refused", uid, {"reason": "max_turns"})

    workers = [threading.Thread(target=traffic, args=(uid, 500))
               for uid in (alice, bob, alice, bob, alice, bob)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    writer.close()

    with db.session() as s:
        ua, ub = usage_today(s, alice), usage_today(s, bob)
        assert (ua.requests, ua.prompt_tokens, ua.completion_tokens) == (1500, 10500, 4500)
        assert (ub.requests, ub.total_tokens) == (1500, 15000)
        assert len(recent_events(s, limit=1000, kind="refused")) == 6 * 10
        threads = {t.user_id: t for t in list_threads(s)}
        assert threads[alice].turns == 500 and threads[bob].turns == 500
        assert all(k.last_used is not None for k in list_keys(s))
    assert writer.flushes >= 1 and writer.failed_flushes == 0


def test_flushes_on_its_own_within_the_interval(db: Database, users) -> None:
    alice, _ = users
    with UsageWriter(db, interval=0.05) as writer:
        writer.add_usage(alice, 100, 20)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with db.session() as s:
                if usage_today(s, alice).requests == 1:
                    break
            time.sleep(0.02)
        with db.session() as s:
            assert usage_today(s, alice).total_tokens == 120
        assert writer.pending_tokens(alice) == 0


def test_a_flush_between_a_transactions_read_and_its_write_does_not_fail_it(db: Database,
                                                                           users) -> None:
    """What an admin request does (read the user, then write their policy) while the usage
    writer commits a batch. With a deferred BEGIN the read took a snapshot, the flush
    committed, and SQLite refused the snapshot's upgrade to a write at once ("database is
    locked", no busy wait): the admin API answered 500 now and then under traffic."""
    alice, _ = users
    writer = UsageWriter(db, interval=3600, start=False)
    writer.add_usage(alice, prompt_tokens=1, completion_tokens=1)
    flushed: list[bool] = []
    flusher = threading.Thread(target=lambda: flushed.append(writer.flush()))
    with db.transaction() as s:
        get_user(s, "alice")  # the read
        flusher.start()
        flusher.join(0.5)  # the writer commits here if the transaction lets it
        set_policy(s, "alice", max_turns=3)  # the write
    flusher.join()
    assert flushed == [True] and writer.failed_flushes == 0
    with db.session() as s:
        assert usage_today(s, alice).requests == 1
        assert get_policy(s, "alice").max_turns == 3


def test_close_flushes_everything_and_then_refuses(db: Database, users) -> None:
    alice, bob = users
    writer = UsageWriter(db, interval=3600)  # the timer never fires: only close() writes
    day = date(2025, 5, 6)
    for _ in range(10):
        writer.add_usage(alice, 1, 2, day=day)
    writer.record_event("preempted", None, {"request": "r1"})
    t0 = datetime(2025, 5, 6, 9, 0, tzinfo=timezone.utc)
    writer.record_thread(bob, "x:abc", 1, 50, 10, seen=t0)
    writer.record_thread(bob, "x:abc", 2, 90, 12, seen=t0 + timedelta(minutes=3))
    with db.session() as s:
        assert list_usage(s) == [] and list_threads(s) == []
    writer.close()
    writer.close()  # idempotent
    with db.session() as s:
        (u,) = list_usage(s)
        assert (u.user_id, u.day, u.requests, u.prompt_tokens, u.completion_tokens) == (
            alice, day, 10, 10, 20)
        assert [e.kind for e in recent_events(s)][0] == "preempted"
        (t,) = list_threads(s)
        assert (t.turns, t.last_prompt_tokens, t.last_completion_tokens, t.length) == (
            2, 90, 12, 102)
        assert (t.first_seen, t.last_seen) == (t0, t0 + timedelta(minutes=3))
    with pytest.raises(RuntimeError, match="closed"):
        writer.add_usage(alice, 1, 1)


def test_thread_stats_across_flushes(db: Database, users) -> None:
    alice, _ = users
    t0 = datetime(2025, 5, 6, 9, 0, tzinfo=timezone.utc)
    with UsageWriter(db, start=False) as writer:
        writer.record_thread(alice, "h:1", 1, 30, 40, seen=t0)
        writer.flush()
        writer.record_thread(alice, "h:1", 2, 80, 10, seen=t0 + timedelta(hours=1))
    with db.session() as s:
        st = get_thread_state(s, alice, "h:1")
        assert (st.turns, st.last_prompt_tokens, st.last_completion_tokens, st.length) == (
            2, 80, 10, 90)
        (t,) = list_threads(s, "alice")
        assert t.first_seen == t0 and t.last_seen == t0 + timedelta(hours=1)
        assert get_thread_state(s, alice, "h:other") is None


def test_failed_flush_keeps_the_updates_for_the_next_one(db: Database, users, monkeypatch) -> None:
    alice, _ = users
    writer = UsageWriter(db, start=False)
    real = db.transaction
    fail = {"left": 1}

    def flaky():
        if fail["left"]:
            fail["left"] -= 1
            raise OperationalError("BEGIN", {}, Exception("database is locked"))
        return real()

    monkeypatch.setattr(db, "transaction", flaky)
    writer.add_usage(alice, 5, 5)
    writer.record_event("refused", alice)
    assert writer.flush() is False and writer.failed_flushes == 1
    writer.add_usage(alice, 1, 1)  # more arrives meanwhile
    assert writer.pending_tokens(alice) == 12
    writer.close()
    with db.session() as s:
        u = usage_today(s, alice)
        assert (u.requests, u.total_tokens) == (2, 12)
        assert len(recent_events(s, kind="refused")) == 1


def test_a_bad_update_does_not_block_the_others(db: Database, users) -> None:
    alice, _ = users
    writer = UsageWriter(db, start=False)
    writer.add_usage(alice, 1, 1)
    writer.add_usage(999, 1, 1)  # no such user: the foreign key refuses it
    writer.record_event("refused", alice)
    assert writer.flush() is True
    assert writer.dropped == 1
    writer.close()
    with db.session() as s:
        assert usage_today(s, alice).requests == 1
        assert [u.user_id for u in list_usage(s)] == [alice]
        assert len(recent_events(s, kind="refused")) == 1


def _snapshot(path: Path) -> dict[str, list]:
    con = sqlite3.connect(path)
    try:
        return {
            "users": con.execute("SELECT * FROM users ORDER BY id").fetchall(),
            # last_used is the writer's to update; everything else must be untouched
            "api_keys": con.execute("SELECT id, user_id, key_hash, prefix, created, revoked "
                                    "FROM api_keys ORDER BY id").fetchall(),
            "policies": con.execute("SELECT * FROM policies ORDER BY id").fetchall(),
        }
    finally:
        con.close()


def _requests(path: Path) -> int:
    con = sqlite3.connect(path, timeout=10)
    try:
        return con.execute("SELECT coalesce(sum(requests), 0) FROM usage").fetchone()[0]
    finally:
        con.close()


def test_sigkill_mid_traffic_leaves_a_sound_database(sqlite_db: Database) -> None:
    db = sqlite_db
    _two_users(db)
    with db.transaction() as s:
        set_policy(s, None, max_context_tokens=8192, on_limit="notify")
        set_policy(s, "alice", max_turns=40)
    db.close()
    before = _snapshot(db.path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(5)
    seen = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("usage_traffic.py")),
                                 str(db.path)], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "started"
            deadline = time.monotonic() + 30
            while _requests(db.path) <= seen + 50 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.05))  # land anywhere in the flush cycle
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        now = _requests(db.path)
        assert now > seen + 50, "the traffic process did not get to write"
        seen = now

    check = Database(db.path)
    try:
        assert check.integrity_check() == "ok"
        with check.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    finally:
        check.close()
    assert _snapshot(db.path) == before
    con = sqlite3.connect(db.path)
    requests, prompt, completion = con.execute(
        "SELECT requests, prompt_tokens, completion_tokens FROM usage").fetchone()
    events = con.execute("SELECT count(*) FROM events WHERE kind = 'traffic'").fetchone()[0]
    con.close()
    # Each flush is one transaction: counters and events stay consistent with each other (an
    # iteration's usage may be one flush ahead of its event, never further).
    assert (prompt, completion) == (10 * requests, 5 * requests)
    assert 0 <= requests - events <= 3


def test_tokens_today_counts_committed_and_queued(db: Database, users) -> None:
    alice, bob = users
    with UsageWriter(db, start=False) as writer:
        writer.add_usage(alice, 100, 50)
        writer.flush()
        writer.add_usage(alice, 10, 5)
        writer.add_usage(bob, 1, 1)
        writer.add_usage(alice, 1000, 0, day=date(2020, 1, 1))  # another day: not today's
        assert writer.tokens_today(alice) == 165
        assert writer.tokens_today(bob) == 2


def test_the_daily_quota_counts_a_persons_every_model_queued_and_written(db: Database,
                                                                         users) -> None:
    alice, bob = users
    writer = UsageWriter(db, start=False)
    writer.add_usage(alice, 10, 5, model="smollm2")
    writer.add_usage(alice, 4, 0, model="minilm", embedding=True)
    writer.add_usage(bob, 100, 100, model="smollm2")
    assert writer.tokens_today(alice) == 19  # queued
    writer.flush()
    writer.add_usage(alice, 1, 1, model="qwen3")
    assert writer.tokens_today(alice) == 21  # written, plus queued
    writer.close()
    with db.session() as s:
        (day,) = list_usage(s, "alice")
    assert (day.requests, day.total_tokens) == (3, 21)  # one day, its models summed
