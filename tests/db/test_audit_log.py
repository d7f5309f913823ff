"""The audit log in the database (app/db/audit.py) and from the CLI: the CLI's own changes
are recorded as cli:USER, a change and its row commit together or not at all, `officellm
audit` reads and filters the log, and nothing but app/db/audit.py writes it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from officellm.app.db import admin_changes
from officellm.app.db.audit import AuditQuery, audit_entries, record_change
from officellm.app.db.database import Database
from officellm.cli import main
from officellm.cli.actor import cli_actor
from tests.support.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, target: Path | str, *argv: str) -> tuple[int, str, str]:
    """The command on `target`: a SQLite file (--db) or a database URL (--database-url)."""
    flag = "--db" if isinstance(target, Path) else "--database-url"
    with pytest.raises(SystemExit) as exc:
        main([*argv, flag, str(target)])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _log(capsys, target: Path | str, *filters: str) -> list[dict]:
    code, out, err = run(capsys, target, "audit", "--json", *filters)
    assert code == 0, err
    return json.loads(out)


def test_the_clis_own_changes_are_recorded_as_cli_and_the_os_user(
        capsys, db_target: Path | str, tmp_path: Path) -> None:
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    no_server = f"http://127.0.0.1:{free_port()}"
    steps = [
        (("users", "add", "alice"), "user.create", "alice"),
        (("users", "disable", "alice"), "user.disable", "alice"),
        (("users", "enable", "alice"), "user.enable", "alice"),
        (("keys", "issue", "alice"), "key.issue", "1"),
        (("keys", "revoke", "1"), "key.revoke", "1"),
        (("policy", "set", "--max-turns", "40"), "policy.set", "default"),
        (("policy", "set", "--user", "alice", "--max-turns", "4"), "policy.set", "alice"),
        (("policy", "clear", "--user", "alice"), "policy.clear", "alice"),
        (("models", "add", "tiny", str(model)), "model.add", "tiny"),
        (("models", "pin", "tiny"), "model.change", "tiny"),
        (("models", "remove", "tiny"), "model.remove", "tiny"),
        # No server to ask: the CLI purges the disk tier and deletes the row itself.
        (("users", "purge-cache", "alice", "--url", no_server), "user.purge_cache", "alice"),
        (("users", "delete", "alice", "--url", no_server), "user.delete", "alice"),
    ]
    for argv, _, _ in steps:
        code, _, err = run(capsys, db_target, *argv)
        assert code == 0, (argv, err)
    rows = _log(capsys, db_target, "--limit", "1000")
    assert [(r["actor"], r["action"], r["target"]) for r in reversed(rows)] == [
        (cli_actor(), action, target) for _, action, target in steps]
    by_action = {r["action"]: r for r in rows}
    assert by_action["user.disable"]["before"]["disabled"] is False
    assert by_action["user.disable"]["after"]["disabled"] is True
    assert by_action["model.change"]["after"]["pinned"] is True
    assert by_action["user.delete"]["after"] is None


def test_the_actor_is_cli_and_the_os_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "alice")
    monkeypatch.setenv("USER", "alice")
    assert cli_actor() == "cli:alice"


def test_a_refused_change_writes_no_row(db: Database) -> None:
    with pytest.raises(ValueError), db.transaction() as s:
        admin_changes.set_policy(s, "cli:alice", None, max_turns=-1)
    with pytest.raises(ValueError), db.transaction() as s:
        admin_changes.create_user(s, "cli:alice", "bob")
        admin_changes.create_user(s, "cli:alice", "bob")  # taken: the first goes too
    with db.session() as s:
        assert audit_entries(s, AuditQuery()) == []


def test_secret_fields_are_dropped_at_any_depth(sqlite_db: Database) -> None:
    with sqlite_db.transaction() as s:
        record_change(s, "cli:alice", "key.issue", "1", None,
                      {"id": 1, "raw": "ocl-x", "nested": [{"key_hash": "abc", "ok": 1}]})
    with sqlite_db.session() as s:
        (row,) = audit_entries(s, AuditQuery())
    assert row.after == {"id": 1, "nested": [{"ok": 1}]}


def test_the_audit_command_filters_and_prints_a_table(capsys, db_path: Path) -> None:
    for argv in (("users", "add", "alice"), ("users", "add", "bob"),
                 ("users", "disable", "bob")):
        assert run(capsys, db_path, *argv)[0] == 0
    assert [r["target"] for r in _log(capsys, db_path, "--action", "user.create")] == [
        "bob", "alice"]  # newest first
    assert len(_log(capsys, db_path, "--actor", "cli")) == 3
    assert _log(capsys, db_path, "--actor", "console") == []
    assert len(_log(capsys, db_path, "--limit", "1")) == 1
    assert _log(capsys, db_path, "--since", "2999-01-01") == []
    assert len(_log(capsys, db_path, "--until", "2999-01-01T00:00+01:00")) == 3
    code, out, _ = run(capsys, db_path, "audit")
    assert code == 0
    header, newest = out.splitlines()[:2]
    assert header.split()[:4] == ["TIME", "ACTOR", "ACTION", "TARGET"]
    assert cli_actor() in newest and "user.disable" in newest
    assert "disabled: false -> true" in newest


def test_nothing_but_app_db_audit_writes_the_log() -> None:
    """Append-only from the server's side: only app/db/audit.py (which adds and reads rows)
    names the table's class, and no code names the table to update or delete it."""
    allowed = {ROOT / "app/db/audit.py", ROOT / "app/db/tables.py"}
    naming = sorted(str(p.relative_to(ROOT)) for folder in ("app", "cli", "admin_ui")
                    for p in (ROOT / folder).rglob("*.py")
                    if p not in allowed and ("AuditEntryRow" in p.read_text()
                                             or '"audit_log"' in p.read_text()))
    assert naming == []


def test_times_at_the_ends_of_the_calendar_are_the_ends_of_the_range(sqlite_db: Database) -> None:
    with sqlite_db.transaction() as s:
        record_change(s, "cli:alice", "user.create", "alice", None, {"name": "alice"})
    first = datetime.fromisoformat("0001-01-01T00:00:00+05:00")  # before year 1 in UTC
    last = datetime.fromisoformat("9999-12-31T23:59:59-05:00")  # after 9999 in UTC
    with sqlite_db.session() as s:
        assert len(audit_entries(s, AuditQuery(since=first, until=last))) == 1
        assert audit_entries(s, AuditQuery(since=last)) == []
