"""The install key: a Fernet key (AES-128-CBC with an HMAC-SHA256) in a file only the
server's owner can read, under which the secrets the server must read back are sealed in the
database (front-end keys' JWT secrets: app/db/jwt_secrets.py).

A copy of the database alone (a backup, a dump, a support bundle) holds no secret it can
use; the replicas sharing a database each have a copy of the file (docs/cluster.md). The
file sits with the admin token: beside a SQLite database, in the data directory for a
shared one (Database.files_dir)."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from officellm.app.db.private_file import write_private_file

INSTALL_KEY_FILENAME = "install_key"


class SealError(RuntimeError):
    """A sealed secret that cannot be opened here: no install key file, or another one."""


class InstallKey:
    """The install key file at `path`, made the first time something is sealed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def key_id(self) -> str | None:
        """A short fingerprint of this machine's install key (None: no file yet). The
        database records the first one's, so that a machine with another is told, not
        allowed to seal under a second key."""
        try:
            return hashlib.sha256(self.path.read_bytes().strip()).hexdigest()[:16]
        except FileNotFoundError:
            return None

    def _load(self, create: bool) -> Fernet:
        # Read each time (rarely: sealing is per key issued, opening once per key and run),
        # so an install key copied here while the server runs is used at once.
        with self._lock:
            try:
                key = self.path.read_bytes().strip()
            except FileNotFoundError:
                if not create:
                    raise SealError(f"there is no install key file ({self.path}) on this "
                                    "machine: copy it from the machine that issued the key "
                                    "(docs/cluster.md)") from None
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Another process may make it at the same moment: whichever file is there
                # first is the key.
                write_private_file(self.path, Fernet.generate_key().decode() + "\n",
                                   replace=False)
                key = self.path.read_bytes().strip()
            except OSError as exc:
                raise SealError(f"the install key file {self.path} cannot be read "
                                f"({exc.strerror or exc})") from exc
            try:
                return Fernet(key)
            except ValueError as exc:
                raise SealError(f"the install key file {self.path} holds no Fernet key") from exc

    def derive(self, purpose: str) -> bytes:
        """A 32-byte key for `purpose` (e.g. the KV disk tier's), derived from the install
        key (made if missing): the same on every start, and useless without the file."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        self._load(create=True)  # made if missing; then read as it is on disk
        secret = base64.urlsafe_b64decode(self.path.read_bytes().strip())
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                    info=f"officellm {purpose}".encode()).derive(secret)

    def seal(self, secret: str) -> str:
        """`secret`, encrypted and authenticated under the install key (made if missing)."""
        return self._load(create=True).encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, sealed: str) -> str:
        """The secret `sealed` holds; SealError when this machine's install key is missing
        or is not the one it was sealed under."""
        try:
            return self._load(create=False).decrypt(sealed.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise SealError(f"the install key file {self.path} is not the one this secret was "
                            "sealed under: copy the install key from the machine that issued "
                            "the key (docs/cluster.md)") from None
