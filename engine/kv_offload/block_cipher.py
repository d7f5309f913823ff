"""How a KV block is sealed on disk: AES-256-GCM under a key derived from the install's
secret, and file names that are keyed hashes, so a directory listing tells nobody which
prompts (or whose) are cached."""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# A file's first bytes: what it is and its layout's version (a stale version is a miss).
MAGIC = b"OLKV\x01"
NONCE_BYTES = 12
TAG_BYTES = 16  # GCM's authentication tag, after the ciphertext


class SealBroken(ValueError):
    """A sealed block that does not open: another install's key, another model, another
    block, or bytes changed or cut short."""


class BlockCipher:
    """Seals and opens blocks, and names them, under one secret (the engine's
    kv_disk_key: 32 bytes the server derives from its install key)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the KV disk tier's key must be at least 16 bytes")
        keys = HKDF(algorithm=hashes.SHA256(), length=64, salt=None,
                    info=b"officellm kv disk tier v1").derive(secret)
        self._aead = AESGCM(keys[:32])
        self._name_key = keys[32:]

    def name(self, *parts: bytes) -> str:
        """A file or folder name for `parts` (hex, 32 characters): the same parts give the
        same name under one key, and nothing about them can be read from it."""
        mac = hmac.new(self._name_key, digestmod=hashlib.blake2b)
        for part in parts:
            mac.update(len(part).to_bytes(4, "little") + part)
        return mac.hexdigest()[:32]

    def seal(self, payload: bytes | memoryview, bound_to: bytes) -> bytes:
        """`payload` encrypted and authenticated, bound to `bound_to` (the model's identity
        and the block's key: opening it as another block fails)."""
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + nonce + self._aead.encrypt(nonce, bytes(payload), MAGIC + bound_to)

    def open_into(self, sealed: bytes | bytearray | memoryview, bound_to: bytes,
                  out: memoryview) -> None:
        """Open `sealed` (as `open`) into `out`, which must be exactly the payload's size."""
        head = len(MAGIC) + NONCE_BYTES
        view = memoryview(sealed)
        if len(view) != head + len(out) + TAG_BYTES or view[:len(MAGIC)] != MAGIC:
            raise SealBroken(f"{len(view)} bytes: not a sealed block of this size and version")
        try:
            self._aead.decrypt_into(bytes(view[len(MAGIC):head]), view[head:],
                                    MAGIC + bound_to, out)
        except InvalidTag:
            raise SealBroken("the block does not open under this key as this block") from None

    def open(self, sealed: bytes, bound_to: bytes) -> bytes:
        """The payload `sealed` holds; SealBroken if it is not what `seal(_, bound_to)`
        made under this key, whole."""
        head = len(MAGIC) + NONCE_BYTES
        if len(sealed) <= head or not sealed.startswith(MAGIC):
            raise SealBroken("not a sealed KV block of this version")
        try:
            body = memoryview(sealed)[head:]  # not copied
            return self._aead.decrypt(sealed[len(MAGIC):head], body, MAGIC + bound_to)
        except InvalidTag:
            raise SealBroken("the block does not open under this key as this block") from None
