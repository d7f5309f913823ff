"""The HS256 secrets of front-end keys: in private files beside the database, fingerprinted in it.

A front end such as Open WebUI signs each request's person into a JWT with a secret it shares
with officellm (docs/design.md §5). Checking an HS256 signature means computing it again, so
the server needs the secret itself: unlike an API key, it cannot be kept only as a hash. So:
- the secret is written to `jwt_secrets/key-<id>` beside the database, the directory 0700 and
  the file 0600 from the moment they exist (as the admin token file: app/db/admin_token.py);
- the database keeps only its scrypt fingerprint (`api_keys.jwt_secret_hash`), so a copy of
  the database alone (a backup, a support bundle) does not hold it, and the server can tell a
  missing or swapped file from the one the key was issued with;
- the secret is useless without the front-end key too: a JWT is only read on a request that
  also carries that key (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

from officellm.app.db.private_file import write_private_file

# HS256 is HMAC-SHA256: a key shorter than the hash's 32 bytes weakens it (RFC 7518 §3.2), and
# PyJWT warns about one. Open WebUI takes whatever string it is given, so we ask for enough.
MIN_SECRET_CHARS = 32
MAX_SECRET_CHARS = 4096

# scrypt, because an admin may pick a guessable secret and the fingerprint must not make
# guessing it cheap; computed once when the key is issued and once per server run.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_SCHEME = "scrypt"


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
    """The secret files of one database. `load` caches what it has checked: a key's secret
    never changes (a new secret is a new key), and scrypt is too slow to run per request."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._checked: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()

    def path(self, key_id: int) -> Path:
        return self.directory / f"key-{int(key_id)}"

    def save(self, key_id: int, secret: str) -> str:
        """Write the secret of key `key_id` (0600, atomically); return its fingerprint."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self.path(key_id)
        write_private_file(path, secret)
        return fingerprint(secret)

    def load(self, key_id: int, stored_fingerprint: str) -> str:
        """The secret of key `key_id`, checked against the database's fingerprint; raises
        SecretUnavailable when the file is missing or is not that secret."""
        cache_key = (int(key_id), stored_fingerprint)
        with self._lock:
            hit = self._checked.get(cache_key)
        if hit is not None:
            return hit
        try:
            secret = self.path(key_id).read_text(encoding="utf-8")
        except OSError as exc:
            raise SecretUnavailable(f"the JWT secret file of key {key_id} cannot be read "
                                    f"({exc.strerror or exc})") from exc
        if not matches(secret, stored_fingerprint):
            raise SecretUnavailable(f"the JWT secret file of key {key_id} is not the secret "
                                    "the key was issued with")
        with self._lock:
            self._checked[cache_key] = secret
        return secret

    def remove(self, key_id: int) -> None:
        """Delete a key's secret file (its key was revoked); no error if there is none."""
        try:
            self.path(key_id).unlink()
        except FileNotFoundError:
            pass
