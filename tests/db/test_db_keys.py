"""API keys and the admin token: hashed at rest, constant-time checks, revocation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from officellm.app.db.admin_token import ensure_admin_token, reset_admin_token, verify_admin_token
from officellm.app.db.database import Database
from officellm.app.db.errors import AlreadyExists, NotFound
from officellm.app.db.events import recent_events
from officellm.app.db.keys import (
    KEY_PREFIX,
    authenticate,
    hash_key,
    issue_key,
    list_keys,
    revoke_key,
)
from officellm.app.db.users import create_user, disable_user, set_user_disabled


def _file_bytes(db: Database) -> bytes:
    db.checkpoint()
    data = db.path.read_bytes()
    wal = Path(str(db.path) + "-wal")
    if wal.exists():
        data += wal.read_bytes()
    return data


def test_raw_key_never_in_the_database_file(sqlite_db: Database) -> None:
    db = sqlite_db
    with db.transaction() as s:
        create_user(s, "alice")
        issued = [issue_key(s, "alice") for _ in range(3)]
    data = _file_bytes(db)
    assert len(data) > 0
    for k in issued:
        assert k.raw.startswith(KEY_PREFIX) and len(k.raw) == 47
        assert k.raw.encode() not in data
        assert k.raw[KEY_PREFIX.__len__():].encode() not in data  # nor its secret part
        assert k.raw[:12].encode() in data  # the shown prefix is stored, by design
        assert hash_key(k.raw).encode() in data  # ... and the hash: the check reads real bytes


def test_authenticate(db: Database) -> None:
    with db.transaction() as s:
        alice = create_user(s, "alice")
        create_user(s, "bob")
        a1 = issue_key(s, "alice")
        a2 = issue_key(s, alice.id)
        b1 = issue_key(s, "bob")
    with db.session() as s:
        who = authenticate(s, a1.raw)
        assert who is not None and (who.user_id, who.name, who.key_id) == (alice.id, "alice",
                                                                           a1.info.id)
        assert authenticate(s, a2.raw).key_id == a2.info.id
        assert authenticate(s, b1.raw).name == "bob"
        assert authenticate(s, "") is None
        assert authenticate(s, a1.raw[:-1]) is None
        assert authenticate(s, a1.raw[:-1] + ("A" if a1.raw[-1] != "A" else "B")) is None
        assert authenticate(s, "Bearer " + a1.raw) is None


def test_revoked_key_and_disabled_user_are_refused(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        create_user(s, "bob")
        k1 = issue_key(s, "alice")
        k2 = issue_key(s, "alice")
        kb = issue_key(s, "bob")
    with db.transaction() as s:
        revoked = revoke_key(s, k1.info.prefix)
        assert revoked.revoked and revoked.id == k1.info.id
    with db.session() as s:
        assert authenticate(s, k1.raw) is None
        assert authenticate(s, k2.raw) is not None  # the user's other key still works
    with db.transaction() as s:
        disable_user(s, "bob")
    with db.session() as s:
        assert authenticate(s, kb.raw) is None
    with db.transaction() as s:
        set_user_disabled(s, "bob", False)
    with db.session() as s:
        assert authenticate(s, kb.raw).name == "bob"
        kinds = [e.kind for e in recent_events(s)]
    assert {"key_issued", "key_revoked", "user_disabled", "user_enabled"} <= set(kinds)


def test_list_and_revoke_by_id_or_prefix(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        create_user(s, "bob")
        ka = issue_key(s, "alice")
        kb = issue_key(s, "bob")
    with db.session() as s:
        assert [k.id for k in list_keys(s)] == [ka.info.id, kb.info.id]
        assert [k.user_name for k in list_keys(s, "bob")] == ["bob"]
    with db.transaction() as s:
        assert revoke_key(s, str(kb.info.id)).revoked
        with pytest.raises(NotFound):
            revoke_key(s, "ocl-doesnotexist")
        with pytest.raises(NotFound):
            revoke_key(s, 999)
        with pytest.raises(ValueError, match="too short"):
            revoke_key(s, "ocl")
        with pytest.raises(NotFound):
            issue_key(s, "nobody")
        with pytest.raises(AlreadyExists):
            create_user(s, "alice")
        with pytest.raises(ValueError, match="invalid user name"):
            create_user(s, "no spaces please")
    with db.session() as s:
        assert [k.revoked for k in list_keys(s)] == [False, True]


def test_admin_token(db: Database) -> None:
    path = ensure_admin_token(db)
    assert path == db.admin_token_path == db.files_dir / "admin_token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    raw = path.read_text().strip()
    assert ensure_admin_token(db) is None  # made once; a restart does not replace it
    assert path.read_text().strip() == raw
    with db.session() as s:
        assert verify_admin_token(s, raw)
        assert not verify_admin_token(s, raw + "x")
        assert not verify_admin_token(s, "")
    new_path = reset_admin_token(db)
    new_raw = new_path.read_text().strip()
    assert new_raw != raw
    with db.session() as s:
        assert verify_admin_token(s, new_raw) and not verify_admin_token(s, raw)


def test_the_raw_admin_token_is_not_in_the_database_file(sqlite_db: Database) -> None:
    raw = ensure_admin_token(sqlite_db).read_text().strip()
    assert raw.encode() not in _file_bytes(sqlite_db)


def test_prepare_database_at_first_and_later_starts(db_path: Path) -> None:
    from officellm.app.db.startup import prepare_database

    db, token_file = prepare_database(db_path)
    assert token_file is not None and token_file.exists() and db.is_at_head()
    db.close()
    db, token_file = prepare_database(db_path)
    assert token_file is None
    db.close()
