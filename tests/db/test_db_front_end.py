"""Front-end keys and the people they speak for, in the data layer: where the JWT secret is kept
(sealed in the database under the install key, never in clear), how people become users and
are found again."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from officellm.app.db.database import Database
from officellm.app.db.forwarded_users import (
    add_forwarded_user,
    find_forwarded_user,
    forwarded_id_digest,
    plain_user_name,
)
from officellm.app.db.jwt_secrets import SecretUnavailable
from officellm.app.db.keys import authenticate, issue_key, list_keys, revoke_key
from officellm.app.db.users import create_user, list_users

SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978"


def _front_end(db: Database, name: str = "open-webui", secret: str | None = SECRET):
    with db.transaction() as s:
        create_user(s, name)
        return issue_key(s, name, forwarded_users=True, jwt_secret=secret,
                         secrets=db.jwt_secrets)


def _who(db: Database, raw: str):
    with db.session() as s:
        who = authenticate(s, raw)
    assert who is not None and who.jwt_secret_hash is not None
    return who


def test_the_secret_is_sealed_in_the_database_under_a_private_install_key(
        sqlite_db: Database) -> None:
    db = sqlite_db
    issued = _front_end(db)
    key_file = db.jwt_secrets.install_key.path
    assert key_file == db.files_dir / "install_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert _who(db, issued.raw).jwt_secret_sealed  # in the database, sealed
    db.checkpoint()  # the WAL into the main file, so both are searched below
    for f in db.path.parent.glob(f"{db.path.name}*"):
        assert SECRET.encode() not in f.read_bytes(), f
    assert (issued.info.forwarded_users, issued.info.jwt_secret) == (True, True)


def test_authenticate_hands_over_what_opens_to_the_secret(db: Database) -> None:
    who = _who(db, _front_end(db).raw)
    assert db.jwt_secrets.load(who.key_id, who.jwt_secret_hash, who.jwt_secret_sealed) == SECRET


def test_another_server_with_the_same_install_key_opens_the_secret(db: Database) -> None:
    """A replica sharing the database, with a copy of the install key file."""
    who = _who(db, _front_end(db).raw)
    other = Database(db.url)  # a new server: nothing opened yet
    try:
        assert other.jwt_secrets.load(who.key_id, who.jwt_secret_hash,
                                      who.jwt_secret_sealed) == SECRET
    finally:
        other.close()


def test_without_the_install_key_or_with_another_the_secret_is_refused(db: Database,
                                                                        tmp_path: Path) -> None:
    who = _who(db, _front_end(db).raw)
    key_file = db.jwt_secrets.install_key.path
    original = key_file.read_bytes()
    key_file.unlink()
    fresh = Database(db.url)
    try:
        with pytest.raises(SecretUnavailable, match="there is no install key file"):
            fresh.jwt_secrets.load(who.key_id, who.jwt_secret_hash, who.jwt_secret_sealed)
    finally:
        fresh.close()
    from cryptography.fernet import Fernet
    key_file.write_bytes(Fernet.generate_key())
    fresh = Database(db.url)
    try:
        with pytest.raises(SecretUnavailable, match="not the one this secret was sealed under"):
            fresh.jwt_secrets.load(who.key_id, who.jwt_secret_hash, who.jwt_secret_sealed)
    finally:
        fresh.close()
        key_file.write_bytes(original)


def test_a_machine_without_the_databases_install_key_does_not_make_a_second_one(
        db: Database) -> None:
    """The first seal records its install key in the database; a replica with none, or with
    another, is told to copy it instead of sealing under a key the others do not have."""
    from cryptography.fernet import Fernet

    from officellm.app.db.jwt_secrets import ForeignInstallKey

    _front_end(db)
    key_file = db.jwt_secrets.install_key.path
    original = key_file.read_bytes()
    key_file.unlink()
    with pytest.raises(ForeignInstallKey, match="there is none"):
        _front_end(db, name="second-ui")
    assert not key_file.exists()
    key_file.write_bytes(Fernet.generate_key())
    with pytest.raises(ForeignInstallKey, match="the one here is another"):
        _front_end(db, name="third-ui")
    key_file.write_bytes(original)  # copied from the machine that made it
    assert _front_end(db, name="fourth-ui").info.jwt_secret


def test_a_sealed_secret_that_is_not_the_keys_own_is_refused(db: Database) -> None:
    first = _who(db, _front_end(db).raw)
    second = _who(db, _front_end(db, name="other-ui",
                                 secret="a" * 32 + "different-secret").raw)
    with pytest.raises(SecretUnavailable, match="not the secret the key was issued with"):
        db.jwt_secrets.load(first.key_id, first.jwt_secret_hash, second.jwt_secret_sealed)


def test_a_secret_file_from_before_is_sealed_in_at_start_and_deleted(db: Database) -> None:
    """Keys issued before secrets were sealed kept them in jwt_secrets/key-<id>."""
    from sqlalchemy import update

    from officellm.app.db.private_file import write_private_file
    from officellm.app.db.startup import prepare_database
    from officellm.app.db.tables import ApiKey

    issued = _front_end(db)
    with db.transaction() as s:  # as an older officellm left it
        s.execute(update(ApiKey).where(ApiKey.id == issued.info.id)
                  .values(jwt_secret_sealed=None))
    legacy = db.jwt_secrets.legacy_path(issued.info.id)
    legacy.parent.mkdir(mode=0o700, parents=True)
    write_private_file(legacy, SECRET)
    with pytest.raises(SecretUnavailable, match="not in the database"):
        Database(db.url).jwt_secrets.load(*_who_args(db, issued.raw))
    restarted, _ = prepare_database(db.url)
    try:
        assert restarted.jwt_secrets.load(*_who_args(restarted, issued.raw)) == SECRET
        assert not legacy.exists()
    finally:
        restarted.close()


def _who_args(db: Database, raw: str) -> tuple:
    who = _who(db, raw)
    return who.key_id, who.jwt_secret_hash, who.jwt_secret_sealed


def test_revoking_a_front_end_key_drops_its_sealed_secret(db: Database) -> None:
    issued = _front_end(db)
    with db.transaction() as s:
        revoke_key(s, issued.info.id, secrets=db.jwt_secrets)
    from officellm.app.db.tables import ApiKey
    with db.session() as s:
        assert s.get(ApiKey, issued.info.id).jwt_secret_sealed is None


@pytest.mark.parametrize("secret, words", [("short", "at least 32"), (" " * 40, "at least 32")])
def test_a_weak_secret_is_refused(db: Database, secret: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        _front_end(db, secret=secret)


def test_a_secret_is_only_for_a_front_end_key(db: Database) -> None:
    with db.transaction() as s:
        create_user(s, "alice")
        with pytest.raises(ValueError, match="front-end key"):
            issue_key(s, "alice", jwt_secret=SECRET, secrets=db.jwt_secrets)


def test_keys_list_tells_front_end_keys_apart(db: Database) -> None:
    _front_end(db, "signed")
    _front_end(db, "plain", secret=None)
    with db.transaction() as s:
        create_user(s, "alice")
        issue_key(s, "alice")
    with db.session() as s:
        kinds = {k.user_name: (k.forwarded_users, k.jwt_secret) for k in list_keys(s)}
    assert kinds == {"signed": (True, True), "plain": (True, False), "alice": (False, False)}


def test_a_person_is_made_a_user_linked_to_their_front_end(db: Database) -> None:
    fe = _front_end(db, secret=None)
    digest = forwarded_id_digest("owui-user-1")
    with db.transaction() as s:
        user = add_forwarded_user(s, fe.info.user_id, digest, ("alice@example.com", "Alice", "x"))
    assert (user.name, user.via) == ("alice@example.com", "open-webui")
    with db.session() as s:
        again = find_forwarded_user(s, fe.info.user_id, digest)
        listed = {u.name: u.via for u in list_users(s)}
    assert again == user
    assert listed == {"alice@example.com": "open-webui", "open-webui": None}


def test_the_front_ends_id_is_stored_hashed(sqlite_db: Database) -> None:
    db = sqlite_db
    fe = _front_end(db, secret=None)
    with db.transaction() as s:
        add_forwarded_user(s, fe.info.user_id, forwarded_id_digest("owui-secret-ish-id"),
                           ("bob@example.com",))
    db.checkpoint()
    assert b"owui-secret-ish-id" not in db.path.read_bytes()


def test_the_same_person_through_another_front_end_is_another_user(db: Database) -> None:
    a = _front_end(db, "open-webui", secret=None)
    b = _front_end(db, "librechat", secret=None)
    digest = forwarded_id_digest("alice@example.com")
    with db.transaction() as s:
        one = add_forwarded_user(s, a.info.user_id, digest, ("alice@example.com",))
        two = add_forwarded_user(s, b.info.user_id, digest, ("alice@example.com",))
    assert one.id != two.id
    assert (one.name, two.name) == ("alice@example.com", "alice@example.com-2")


def test_a_name_someone_else_has_gets_a_suffix(db: Database) -> None:
    fe = _front_end(db, secret=None)
    with db.transaction() as s:
        create_user(s, "carol")  # made by the admin, with a key of her own maybe
        person = add_forwarded_user(s, fe.info.user_id, forwarded_id_digest("c"), ("carol",))
    assert person.name == "carol-2" and person.via == "open-webui"


@pytest.mark.parametrize("given, name", [
    ("alice@example.com", "alice@example.com"), ("Zoë Smith", "Zoe-Smith"),
    ("  .hidden name!  ", "hidden-name"), ("李雷", None), ("x" * 80, "x" * 64),
])
def test_plain_user_names(given: str, name: str | None) -> None:
    assert plain_user_name(given) == name


def test_a_name_with_nothing_usable_falls_back_to_the_next(db: Database) -> None:
    fe = _front_end(db, secret=None)
    with db.transaction() as s:
        person = add_forwarded_user(s, fe.info.user_id, forwarded_id_digest("u-9"),
                                    (None, "李雷", "u-9"))
    assert person.name == "u-9"


def test_the_install_key_is_beside_a_sqlite_database(db_path: Path) -> None:
    db = Database(db_path)
    try:
        assert db.jwt_secrets.install_key.path == db_path.parent / "install_key"
    finally:
        db.close()
