"""`officellm users|keys|policy|db` against a temporary database, through cli.main."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from officellm.app.db.database import Database
from officellm.app.db.keys import authenticate
from officellm.app.db.migrate import head_revision
from officellm.app.db.policies import get_effective_policy
from officellm.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, target: Path | str, *argv: str) -> tuple[int, str, str]:
    """The command on `target`: a SQLite file (--db) or a database URL (--database-url)."""
    flag = "--db" if isinstance(target, Path) else "--database-url"
    with pytest.raises(SystemExit) as exc:
        main([*argv, flag, str(target)])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_users_keys_policy_round_trip(capsys, db_target: Path | str) -> None:
    db_path = db_target
    assert run(capsys, db_path, "users", "add", "alice")[0] == 0  # a fresh file is migrated
    assert run(capsys, db_path, "users", "add", "bob")[0] == 0
    code, _, err = run(capsys, db_path, "users", "add", "alice")
    assert code == 2 and "already exists" in err

    code, out, _ = run(capsys, db_path, "keys", "issue", "alice")
    assert code == 0
    raw = out.splitlines()[0]
    assert raw.startswith("ocl-") and len(raw) == 47
    code, out, _ = run(capsys, db_path, "keys", "list", "--user", "alice")
    assert raw[:12] in out and raw not in out

    db = Database(db_path)
    with db.session() as s:
        assert authenticate(s, raw).name == "alice"

    code, out, _ = run(capsys, db_path, "policy", "set", "--max-context-tokens", "8,192",
                       "--on-limit", "notify", "--max-turns", "40")
    assert code == 0
    code, out, _ = run(capsys, db_path, "policy", "set", "--user", "alice",
                       "--max-context-tokens", "32768", "--share-prefix-cache")
    assert code == 0
    # The running "server" (this Database object) sees the change on its next read.
    with db.session() as s:
        alice = get_effective_policy(s, "alice")
        bob = get_effective_policy(s, "bob")
    assert (alice.max_context_tokens, alice.max_turns, alice.on_limit,
            alice.share_prefix_cache) == (32768, 40, "notify", True)
    assert (bob.max_context_tokens, bob.share_prefix_cache) == (8192, False)

    code, out, _ = run(capsys, db_path, "policy", "show", "--user", "alice", "--json")
    shown = json.loads(out)
    assert shown["stored"]["max_turns"] is None and shown["effective"]["max_turns"] == 40
    code, out, _ = run(capsys, db_path, "policy", "show", "--user", "alice")
    assert "32,768" in out and "(inherit) -> 40" in out

    code, _, err = run(capsys, db_path, "policy", "set", "--max-turns", "0")
    assert code == 2 and "max_turns must be a whole number of at least 1" in err
    code, _, err = run(capsys, db_path, "policy", "set", "--user", "alice")
    assert code == 2 and "nothing to set" in err
    assert run(capsys, db_path, "policy", "set", "--user", "alice", "--max-context-tokens",
               "none")[0] == 0
    with db.session() as s:
        assert get_effective_policy(s, "alice").max_context_tokens == 8192

    assert run(capsys, db_path, "keys", "revoke", raw[:12])[0] == 0
    with db.session() as s:
        assert authenticate(s, raw) is None
    code, out, _ = run(capsys, db_path, "keys", "list")
    assert "revoked" in out

    code, out, _ = run(capsys, db_path, "keys", "issue", "bob")
    raw_b = out.splitlines()[0]
    assert run(capsys, db_path, "users", "disable", "bob")[0] == 0
    code, out, _ = run(capsys, db_path, "users", "list", "--json")
    assert {u["name"]: u["disabled"] for u in json.loads(out)} == {"alice": False, "bob": True}
    with db.session() as s:
        assert authenticate(s, raw_b) is None
    db.close()


def test_db_upgrade_downgrade(capsys, db_target: Path | str) -> None:
    db_path = db_target
    code, out, _ = run(capsys, db_path, "db", "upgrade", "0001_initial")
    assert code == 0 and "0001_initial" in out
    code, out, _ = run(capsys, db_path, "db", "current")
    assert "0001_initial" in out and "not the newest" in out
    code, out, _ = run(capsys, db_path, "db", "upgrade")
    assert head_revision() in out
    code, out, _ = run(capsys, db_path, "db", "downgrade", "base")
    assert code == 0 and "base" in out
    assert Database(db_path).current_revision() is None


def test_installed_entry_point_runs_as_a_process(tmp_path: Path) -> None:
    db_path = tmp_path / "sub.db"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for argv in (["users", "add", "carol"], ["keys", "issue", "carol"]):
        proc = subprocess.run([sys.executable, "-m", "officellm.cli", *argv, "--db", str(db_path)],
                              env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ocl-")


def test_policy_set_priority_and_kv_share(capsys, db_path: Path) -> None:
    assert run(capsys, db_path, "users", "add", "alice")[0] == 0
    code, out, _ = run(capsys, db_path, "policy", "set", "--user", "alice", "--priority", "high",
                       "--max-kv-share", "0.5")
    assert code == 0 and "priority=high" in out and "max_kv_share=0.5 of the KV cache" in out
    assert run(capsys, db_path, "policy", "set", "--max-kv-share", "25%")[0] == 0
    db = Database(db_path)
    with db.session() as s:
        alice = get_effective_policy(s, "alice")
        default = get_effective_policy(s, None)
    db.close()
    assert (alice.priority, alice.max_kv_share) == ("high", 0.5)
    assert (default.priority, default.max_kv_share) == ("normal", 0.25)


def test_policy_set_models_and_back_to_all(capsys, db_path: Path) -> None:
    assert run(capsys, db_path, "users", "add", "alice")[0] == 0
    code, out, _ = run(capsys, db_path, "policy", "set", "--models", "smollm2, minilm")
    assert code == 0 and "models=smollm2, minilm" in out
    code, out, _ = run(capsys, db_path, "policy", "show", "--user", "alice")
    assert "(inherit) -> smollm2, minilm" in out
    assert run(capsys, db_path, "policy", "set", "--user", "alice", "--models", "qwen3-8b")[0] == 0
    code, out, _ = run(capsys, db_path, "policy", "show", "--user", "alice", "--json")
    assert json.loads(out)["effective"]["models"] == ["qwen3-8b"]
    code, out, _ = run(capsys, db_path, "policy", "set", "--models", "all")
    assert code == 0 and "models=all models" in out
    with Database(db_path).session() as s:
        assert get_effective_policy(s, None).models is None
        assert get_effective_policy(s, "alice").models == ("qwen3-8b",)


def test_policy_set_models_refuses_an_empty_list(capsys, db_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["policy", "set", "--models", ",", "--db", str(db_path)])
    assert exc.value.code == 2
    assert "expected model names" in capsys.readouterr().err


def test_policy_set_refuses_a_kv_share_over_one_and_an_unknown_priority(capsys, db_path) -> None:
    assert run(capsys, db_path, "users", "add", "alice")[0] == 0
    code, _, err = run(capsys, db_path, "policy", "set", "--user", "alice", "--max-kv-share", "1.5")
    assert code != 0 and "max_kv_share must be a fraction of the KV pool" in err
    code, _, err = run(capsys, db_path, "policy", "set", "--priority", "urgent")
    assert code != 0 and "choose from low, normal, high" in err


def test_keys_issue_forwarded_users_with_a_jwt_secret_file(capsys, db_path: Path,
                                                           tmp_path: Path) -> None:
    secret_file = tmp_path / "owui.secret"
    secret_file.write_text("9c4f1d2e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e\n")  # as `openssl rand`
    assert run(capsys, db_path, "users", "add", "open-webui")[0] == 0
    code, out, _ = run(capsys, db_path, "keys", "issue", "open-webui", "--forwarded-users",
                       "--jwt-secret-file", str(secret_file))
    assert code == 0 and out.startswith("ocl-") and "front-end key" in out
    db = Database(db_path)
    with db.session() as s:
        who = authenticate(s, out.split()[0])
    assert who is not None and who.forwarded_users and who.jwt_secret_hash is not None
    # Stripped, as Open WebUI strips FORWARD_USER_INFO_HEADER_JWT_SECRET.
    assert db.jwt_secrets.load(who.key_id, who.jwt_secret_hash, who.jwt_secret_sealed) == \
        "9c4f1d2e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e"
    db.close()
    code, out, _ = run(capsys, db_path, "keys", "list")
    assert "front end+jwt" in out


def test_a_jwt_secret_file_needs_forwarded_users(capsys, db_path: Path, tmp_path: Path) -> None:
    secret_file = tmp_path / "owui.secret"
    secret_file.write_text("x" * 40)
    assert run(capsys, db_path, "users", "add", "open-webui")[0] == 0
    code, _, err = run(capsys, db_path, "keys", "issue", "open-webui", "--jwt-secret-file",
                       str(secret_file))
    assert code == 2 and "--forwarded-users" in err


def test_a_short_jwt_secret_is_refused_by_the_cli(capsys, db_path: Path, tmp_path: Path) -> None:
    secret_file = tmp_path / "owui.secret"
    secret_file.write_text("changeme")
    assert run(capsys, db_path, "users", "add", "open-webui")[0] == 0
    code, _, err = run(capsys, db_path, "keys", "issue", "open-webui", "--forwarded-users",
                       "--jwt-secret-file", str(secret_file))
    assert code == 2 and "openssl rand -hex 32" in err


def test_the_database_url_may_come_from_the_environment_and_a_db_file_wins_over_it(
        capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OFFICELLM_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    with pytest.raises(SystemExit):
        main(["users", "add", "erin"])
    assert run(capsys, tmp_path / "flag.db", "users", "add", "frank")[0] == 0
    with pytest.raises(SystemExit):
        main(["users", "list", "--json"])
    assert [u["name"] for u in json.loads(capsys.readouterr()[0])] == ["erin"]


def test_a_database_that_is_neither_sqlite_nor_postgresql_is_refused(capsys) -> None:
    code, _, err = run(capsys, "mysql://u@localhost/db", "users", "list")
    assert code != 0 and "SQLite (a file) or PostgreSQL" in err


def test_a_database_command_imports_neither_torch_nor_the_server(tmp_path: Path) -> None:
    """`officellm users|keys|policy|db|audit` load only their own module: an admin's command
    answers in about a second, not after `serve`'s imports (torch and the engine, several
    seconds)."""
    db = str(tmp_path / "p.db")
    probe = ("import sys\n"
             "from officellm.cli import main\n"
             f"for argv in (['users', 'add', 'dave', '--db', {db!r}], ['audit', '--db', {db!r}]):\n"
             "    try:\n"
             "        main(argv)\n"
             "    except SystemExit as exc:\n"
             "        assert exc.code == 0, exc.code\n"
             "print(sorted(m for m in ('torch', 'officellm.engine', 'officellm.app.server')\n"
             "             if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_a_url_given_to_db_is_refused_with_the_flag_that_takes_it(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["users", "list", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert exc.value.code == 2
    assert "--database-url" in capsys.readouterr().err


def _alice_and_bob_on_disk(capsys, tmp_path: Path) -> Path:
    """A database with alice and bob, each with one block in the KV disk tier beside it."""
    from officellm.app.db.paths import kv_disk_dir
    from officellm.app.db.users import get_user
    from officellm.app.policy import prefix_cache_salt
    from officellm.engine.kv_offload.disk_tier import DiskTier

    db_path = tmp_path / "officellm.db"
    for name in ("alice", "bob"):
        assert run(capsys, db_path, "users", "add", name)[0] == 0
    db = Database(db_path)
    with db.session() as s:
        ids = {name: get_user(s, name).id for name in ("alice", "bob")}
    tier = DiskTier(kv_disk_dir(db.files_dir), b"a model", db.kv_disk_key(), 1 << 30, 8)
    for name, user_id in ids.items():
        tier.put(name.encode(), prefix_cache_salt(user_id, share_prefix_cache=False), b"kv bytes")
    tier.close()
    db.close()
    assert len(list(kv_disk_dir(tmp_path).rglob("*.kv"))) == 2
    return db_path


def _on_disk(db_path: Path) -> tuple[bool, bool]:
    """Whether alice's and bob's blocks are in the disk tier."""
    from officellm.app.db.paths import kv_disk_dir
    from officellm.engine.kv_offload.disk_tier import DiskTier

    tier = DiskTier(kv_disk_dir(db_path.parent), b"a model", Database(db_path).kv_disk_key(),
                    1 << 30, 8)
    try:
        return tier.holds(b"alice"), tier.holds(b"bob")
    finally:
        tier.close()


def test_purge_cache_with_no_server_removes_the_users_files_from_the_disk_tier(
        capsys, tmp_path: Path) -> None:
    from tests.support.server_process import free_port

    db_path = _alice_and_bob_on_disk(capsys, tmp_path)
    code, _, err = run(capsys, db_path, "users", "purge-cache", "alice", "--url",
                       f"http://127.0.0.1:{free_port()}")
    assert code == 0
    assert "removed their blocks" in err
    assert _on_disk(db_path) == (False, True)


def test_delete_with_no_server_removes_the_user_their_keys_and_their_files(
        capsys, tmp_path: Path) -> None:
    from tests.support.server_process import free_port

    db_path = _alice_and_bob_on_disk(capsys, tmp_path)
    assert run(capsys, db_path, "keys", "issue", "alice")[0] == 0
    code, _, err = run(capsys, db_path, "users", "delete", "alice", "--url",
                       f"http://127.0.0.1:{free_port()}")
    assert code == 0
    assert "deleted them" in err
    assert _on_disk(db_path) == (False, True)
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT name FROM users").fetchall() == [("bob",)]
    assert con.execute("SELECT count(*) FROM api_keys").fetchone() == (0,)
    con.close()


def _usage_counted(target: Path | str) -> None:
    """Alice's and bob's usage of two models today, as the server's writer counts it."""
    from officellm.app.accounts.usage_writer import UsageWriter
    from officellm.app.db.users import create_user

    db = Database(target)
    db.upgrade()
    with db.transaction() as s:
        alice, bob = create_user(s, "alice").id, create_user(s, "bob").id
    with UsageWriter(db, start=False) as writer:
        writer.add_usage(alice, 100, 20, model="smollm2", cached_tokens=64, busy_seconds=1.5)
        writer.add_usage(alice, 30, 5, model="smollm2", task=True, busy_seconds=0.5)
        writer.add_usage(alice, 12, 0, model="minilm", embedding=True, busy_seconds=0.1)
        writer.add_usage(bob, 7, 3, model="smollm2", busy_seconds=0.2)
    db.close()


def test_usage_csv_parses_and_sums_each_users_models(capsys, db_target: Path | str) -> None:
    import csv

    _usage_counted(db_target)
    code, out, _ = run(capsys, db_target, "usage", "--by", "user", "--csv")
    assert code == 0
    rows = {r["user"]: r for r in csv.DictReader(out.splitlines())}
    assert set(rows) == {"alice", "bob"}
    alice = rows["alice"]
    assert {k: int(alice[k]) for k in ("requests", "prompt_tokens", "cached_tokens",
                                       "completion_tokens", "embedding_requests",
                                       "embedding_tokens", "task_requests", "task_tokens")} == {
        "requests": 3, "prompt_tokens": 142, "cached_tokens": 64, "completion_tokens": 25,
        "embedding_requests": 1, "embedding_tokens": 12, "task_requests": 1, "task_tokens": 35}
    assert float(alice["busy_seconds"]) == 2.1
    code, out, _ = run(capsys, db_target, "usage", "--by", "model", "--csv", "--user", "bob")
    assert [(r["model"], r["requests"]) for r in csv.DictReader(out.splitlines())] == [
        ("smollm2", "1")]


def test_usage_table_by_day_ends_with_the_total(capsys, db_path: Path) -> None:
    from officellm.app.db.usage import utc_today

    _usage_counted(db_path)
    today = utc_today().isoformat()
    code, out, _ = run(capsys, db_path, "usage", "--by", "day", "--since", today)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["DAY", "REQUESTS", "PROMPT"]
    assert lines[2].split()[:3] == [today, "4", "149"]
    assert lines[-1].split()[:3] == ["TOTAL", "4", "149"]
    code, _, err = run(capsys, db_path, "usage", "--since", "2026-12-07", "--until",
                       "2026-12-01")
    assert code == 2 and "is before since" in err
