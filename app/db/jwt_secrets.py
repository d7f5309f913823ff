"""The HS256 secrets of front-end keys: sealed in the database under the install key, and
fingerprinted.

A front end such as Open WebUI signs each request's person into a JWT with a secret it shares
with officellm (docs/design.md §5). Checking an HS256 signature means computing it again, so
the server needs the secret itself: unlike an API key, it cannot be kept only as a hash. So:
- the database keeps it sealed (`api_keys.jwt_secret_sealed`: Fernet under the install key,
  a 0600 file: app/db/install_key.py), so every replica sharing the database can check a
  key's JWTs, and a copy of the database alone (a backup, a dump) cannot open it;
- and its scrypt fingerprint (`api_keys.jwt_secret_hash`), so a sealed secret that does not
  open to the one the key was issued with is refused;
- the secret is useless without the front-end key too: a JWT is only read on a request that
  also carries that key (docs/security.md).
Keys issued before kept their secret in a file (`jwt_secrets/key-<id>`); the server seals
those into the database at start and deletes the files (adopt_legacy_files).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import threading
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.install_key import INSTALL_KEY_FILENAME, InstallKey, SealError
from officellm.app.db.install_settings import INSTALL_KEY_ID, get_setting, set_setting
from officellm.app.db.paths import jwt_secrets_dir
from officellm.app.db.tables import ApiKey

# HS256 is HMAC-SHA256: a key shorter than the hash's 32 bytes weakens it (RFC 7518 §3.2), and
# PyJWT warns about one. Open WebUI takes whatever string it is given, so we ask for enough.
MIN_SECRET_CHARS = 32
MAX_SECRET_CHARS = 4096

# scrypt, because an admin may pick a guessable secret and the fingerprint must not make
# guessing it cheap; computed once when the key is issued and once per server run.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_SCHEME = "scrypt"


class ForeignInstallKey(ValueError):
    """This machine's install key is not the one the database's secrets are sealed under."""


class SecretUnavailable(RuntimeError):
    """The key's secret file is missing, unreadable, or not the one the key was issued with."""


def validate_jwt_secret(secret: str) -> str:
    """The secret as Open WebUI uses it (surrounding whitespace stripped, as it strips its
    FORWARD_USER_INFO_HEADER_JWT_SECRET), or ValueError saying what is wrong with it."""
    value = secret.strip()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate from JSON: no bytes to sign with
        raise ValueError("the JWT secret is not valid text") from exc
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(f"the JWT secret must be at least {MIN_SECRET_CHARS} characters "
                         f"(it has {len(value)}); make one with `openssl rand -hex 32`")
    if len(value) > MAX_SECRET_CHARS:
        raise ValueError(f"the JWT secret is longer than {MAX_SECRET_CHARS} characters")
    return value


def fingerprint(secret: str) -> str:
    """`scrypt$<salt>$<hash>` of a secret (base64): what the database stores."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode("utf-8"), salt=salt, dklen=32, **_SCRYPT)
    return "$".join((_SCHEME, base64.b64encode(salt).decode(), base64.b64encode(digest).decode()))


def matches(secret: str, stored: str) -> bool:
    """True when `secret` is the one `stored` (a fingerprint) was made from."""
    try:
        scheme, salt, digest = stored.split("$")
        if scheme != _SCHEME:
            return False
        expected = base64.b64decode(digest)
        got = hashlib.scrypt(secret.encode("utf-8"), salt=base64.b64decode(salt),
                             dklen=len(expected), **_SCRYPT)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


class JwtSecretStore:
    """Front-end keys' JWT secrets, sealed under the install key (app/db/install_key.py) in
    the database, beside their fingerprints. `load` caches what it has opened and checked: a
    key's secret never changes (a new secret is a new key), and scrypt is too slow to run per
    request."""

    def __init__(self, files_dir: Path) -> None:
        """`files_dir`: the database's files directory (Database.files_dir), which holds the
        install key, and the secret files of keys issued before secrets were sealed."""
        self.install_key = InstallKey(Path(files_dir) / INSTALL_KEY_FILENAME)
        self.legacy_dir = jwt_secrets_dir(Path(files_dir))
        self._checked: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()

    def seal(self, session: Session, secret: str) -> tuple[str, str]:
        """What the database keeps of a new key's secret: its fingerprint, and the secret
        sealed under the install key (made now if this is the database's first). Refused
        (ForeignInstallKey) on a machine whose install key is not the one the database's
        secrets are sealed under: a second key would leave each machine unable to open the
        other's secrets."""
        known = get_setting(session, INSTALL_KEY_ID)
        here = self.install_key.key_id()
        if known is not None and here != known:
            which = "there is none" if here is None else "the one here is another"
            raise ForeignInstallKey(
                "this database's JWT secrets are sealed under the install key made on another "
                f"machine, and {which} ({self.install_key.path}): copy that machine's "
                "install_key file here first (docs/cluster.md)")
        sealed = self.install_key.seal(secret)
        if known is None:
            set_setting(session, INSTALL_KEY_ID, self.install_key.key_id() or "")
        return fingerprint(secret), sealed

    def load(self, key_id: int, stored_fingerprint: str, sealed: str | None) -> str:
        """The secret of key `key_id`, opened and checked against its fingerprint; raises
        SecretUnavailable when it cannot be opened here or is not that secret."""
        cache_key = (int(key_id), stored_fingerprint)
        with self._lock:
            hit = self._checked.get(cache_key)
        if hit is not None:
            return hit
        if sealed is None:
            raise SecretUnavailable(f"the JWT secret of key {key_id} is not in the database "
                                    "(a key issued before secrets were kept there, whose file "
                                    f"was not in {self.legacy_dir} at start)")
        try:
            secret = self.install_key.open(sealed)
        except SealError as exc:
            raise SecretUnavailable(f"the JWT secret of key {key_id} cannot be opened: "
                                    f"{exc}") from exc
        if not matches(secret, stored_fingerprint):
            raise SecretUnavailable(f"the JWT secret of key {key_id} is not the secret the key "
                                    "was issued with")
        with self._lock:
            self._checked[cache_key] = secret
        return secret

    def legacy_path(self, key_id: int) -> Path:
        """Where a key issued before secrets were sealed kept its secret."""
        return self.legacy_dir / f"key-{int(key_id)}"

    def adopt_legacy_files(self, session: Session) -> list[int]:
        """Seal into the database the secret files of keys issued before (checked against
        their fingerprints), then delete the files; the ids of the keys adopted. A file that
        is missing or not its key's secret is left, and its key refused, as before."""
        adopted = []
        pending = session.scalars(select(ApiKey).where(ApiKey.jwt_secret_hash.is_not(None),
                                                       ApiKey.jwt_secret_sealed.is_(None)))
        for key in pending:
            path = self.legacy_path(key.id)
            try:
                secret = path.read_text(encoding="utf-8")
            except OSError:
                continue
            if key.jwt_secret_hash is not None and matches(secret, key.jwt_secret_hash):
                try:
                    key.jwt_secret_sealed = self.seal(session, secret)[1]
                except ForeignInstallKey:
                    break  # the files stay, and their keys refused, until the key is here
                adopted.append(key.id)
        session.flush()
        for key_id in adopted:
            self.forget_file(key_id)
        return adopted

    def forget_file(self, key_id: int) -> None:
        """Delete a key's legacy secret file, if there is one."""
        with contextlib.suppress(FileNotFoundError):
            self.legacy_path(key_id).unlink()
