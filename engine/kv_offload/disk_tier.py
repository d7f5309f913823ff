"""The disk tier: KV blocks as sealed files in a directory, within a byte budget, least
recently used out first, each kept at most a retention time.

Layout: `<dir>/<model>/<owner>/<block>.kv`. `<model>` names the model's identity (its files,
dtype, KV layout: engine/kv_offload/kv_identity.py), `<owner>` the requests' prefix-cache
salt (a person, under the server's policies), `<block>` the block's prefix-cache key; all
three are keyed hashes (block_cipher.py), so a listing reveals no prompt and no person.
A file holds one block's pages of every cache tensor, sealed (AES-GCM) and bound to its
model and key: one from another install, model or block, or cut short, is a miss.

Writes and reads run on two threads of their own; the engine's thread only queues them.
A write goes to a temporary name and is renamed into place, so a reader (or a second
process on the same directory) never sees half a file. A full disk or a directory that
cannot be written turns writing off with one WARNING; serving goes on, reading what is
there.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from officellm.engine.kv_offload.block_cipher import (
    MAGIC,
    NONCE_BYTES,
    TAG_BYTES,
    BlockCipher,
    SealBroken,
)
from officellm.engine.stats import DiskTierStats

logger = logging.getLogger(__name__)

SUFFIX = ".kv"
# Copies blocks' bytes into pool blocks (the executor's write_blocks).
PlaceBlocks = Callable[[list[int], list[memoryview]], None]
# Writes queued but not yet on disk, at most (and never more than the pool): past it a block
# is not saved (it stays in the pool as before), so a burst of prefill never grows the
# engine's memory.
MAX_PENDING_WRITE_BYTES = 256 << 20
# Threads reading blocks back, two at a time while the engine waits: each reads a run of
# files, opens them into its own buffer (about this size) and copies the run into the pool
# blocks set aside for them.
READER_THREADS = 2
READ_RUN_BYTES = 8 << 20


def read_run_blocks(block_bytes: int) -> int:
    """The blocks a reader thread opens before copying them into the pool at once."""
    return max(1, READ_RUN_BYTES // block_bytes)


def disk_tier_memory_bytes(pool_bytes: int) -> int:
    """The RAM a disk tier under a pool of this size holds at most: queued writes, and each
    reader thread's buffer (blocks read back go straight into the pool; a block over
    READ_RUN_BYTES, which no model here has, would make a buffer of one block)."""
    return min(MAX_PENDING_WRITE_BYTES, pool_bytes) + READER_THREADS * READ_RUN_BYTES
# How often the writer looks for files past the retention time.
EXPIRY_INTERVAL_S = 60.0
# A temporary file older than this is a crashed writer's, and removed at start.
STALE_TEMPORARY_S = 600.0


@dataclass
class _File:
    owner: str  # the owner folder's name
    size: int


@dataclass
class _Reads:
    """One waiting request's blocks being read into the pool blocks set aside for them."""

    into: dict[bytes, int]  # each key's pool block
    pending: set[bytes]
    copied: dict[bytes, bool] = field(default_factory=dict)
    # Held while a reader copies into the pool; release() takes it to cancel, so once it
    # returns nothing writes into the request's blocks.
    placing: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False


class DiskTier:
    """Blocks as files in a directory: the lower of KVTiers' two (engine/kv_offload/kv_tiers.py)."""

    def __init__(self, root: Path, identity: bytes, secret: bytes, capacity_bytes: int,
                 block_bytes: int, ttl_seconds: float | None = None,
                 pool_bytes: int | None = None,
                 place: PlaceBlocks | None = None) -> None:
        self.root = Path(root)
        self.max_pending_bytes = min(MAX_PENDING_WRITE_BYTES,
                                     pool_bytes or MAX_PENDING_WRITE_BYTES)
        # Copies blocks' bytes into pool blocks, from a reader thread (the executor's
        # write_blocks); None: a tier that is written and purged only (no pool).
        self._place = place
        self.identity = identity
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.ttl_seconds = ttl_seconds
        self._cipher = BlockCipher(secret)
        self.model_dir = self.root / self._cipher.name(b"model", identity)
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _File] = OrderedDict()  # least recently used first
        self._bytes_used = 0
        self._owner_bytes: dict[str, int] = {}  # per owner folder (a person's salt)
        self._names: dict[bytes, str] = {}
        self._queued: set[str] = set()
        self._pending_bytes = 0
        # Writes are numbered as queued; a purge drops its owner's writes queued before it.
        self._sequence = 0
        self._purged_through: dict[str, int] = {}
        self._writing = threading.Lock()  # held through each write, and through a purge
        self._reads: dict[str, _Reads] = {}
        self._read_done = threading.Event()
        self._seconds_per_read: float | None = None  # a block's read and open, averaged
        self._writable = True
        self.blocks_written = self.blocks_read = self.blocks_unreadable = 0
        self.writes_dropped = 0
        self._closed = False
        self._scan()
        self._expire()
        self._write_queue: queue.Queue[tuple[int, str, str, bytes, bytes] | None] = queue.Queue()
        self._read_queue: queue.Queue[tuple[str, _Reads, list[bytes]] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer",
                                        daemon=True)
        self._readers = [threading.Thread(target=self._read_loop, name=f"kv-disk-reader-{i}",
                                          daemon=True) for i in range(READER_THREADS)]
        self._writer.start()
        for reader in self._readers:
            reader.start()

    # -- what is there -------------------------------------------------------------------
    def _scan(self) -> None:
        """Index the files a previous run left, oldest use first (their mtimes)."""
        try:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
        except OSError as exc:
            self._turn_off_writes(exc)
            return
        found: list[tuple[float, str, _File]] = []
        now = time.time()
        for owner in _subdirs(self.model_dir):
            for entry in _entries(owner):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if not entry.name.endswith(SUFFIX):
                    if now - st.st_mtime > STALE_TEMPORARY_S:
                        _unlink(Path(entry.path))
                    continue
                found.append((st.st_mtime, entry.name[:-len(SUFFIX)],
                              _File(owner.name, st.st_size)))
        for _, name, file in sorted(found, key=lambda f: f[0]):
            self._add(name, file)
        if found:
            logger.info("KV disk tier: %d blocks (%.1f MiB) kept from earlier runs in %s",
                        len(found), self._bytes_used / 2**20, self.model_dir)
        self._enforce_budget()

    def holds(self, key: bytes) -> bool:
        """See LowerTier."""
        return self._name(key) in self._files

    def stats(self) -> DiskTierStats:
        with self._lock:
            return DiskTierStats(len(self._files), self._bytes_used, self.capacity_bytes,
                                 self.blocks_written, self.blocks_read, self.blocks_unreadable,
                                 self.writes_dropped, self._writable, dict(self._owner_bytes))

    def _name(self, key: bytes) -> str:
        name = self._names.get(key)
        if name is None:
            if len(self._names) > 1 << 20:  # a bound on the memo, not on the tier
                self._names.clear()
            name = self._names[key] = self._cipher.name(b"block", self.identity, key)
        return name

    def _owner(self, cache_salt: str | None) -> str:
        return owner_folder(self._cipher, cache_salt)

    def _path(self, owner: str, name: str) -> Path:
        return self.model_dir / owner / (name + SUFFIX)

    # -- writing -------------------------------------------------------------------------
    def put(self, key: bytes, cache_salt: str | None, payload: bytes) -> None:
        """Queue one block's bytes to be sealed and written (not if it is there already,
        writing is off, or the queue is full)."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes, not {len(payload)}")
        name = self._name(key)
        with self._lock:
            if not self._writable or name in self._files or name in self._queued:
                return
            if self._pending_bytes + len(payload) > self.max_pending_bytes:
                self.writes_dropped += 1
                return
            self._queued.add(name)
            self._pending_bytes += len(payload)
            self._sequence += 1
            sequence = self._sequence
        self._write_queue.put((sequence, name, self._owner(cache_salt), key, payload))

    def _write_loop(self) -> None:
        next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
        while True:
            try:
                job = self._write_queue.get(timeout=EXPIRY_INTERVAL_S)
            except queue.Empty:
                job = ...
            if job is None:
                return
            if job is not ...:
                sequence, name, owner, key, payload = job
                try:
                    with self._writing:
                        if sequence > self._purged_through.get(owner, 0):
                            self._write(name, owner, key, payload)
                except Exception as exc:  # noqa: BLE001 - a bug: stop writing, keep serving
                    logger.exception("KV disk tier: writing a block failed")
                    self._turn_off_writes(exc)
                finally:
                    with self._lock:
                        self._queued.discard(name)
                        self._pending_bytes -= len(payload)
            if time.monotonic() >= next_expiry:
                self._expire()
                next_expiry = time.monotonic() + EXPIRY_INTERVAL_S

    def _write(self, name: str, owner: str, key: bytes, payload: bytes) -> None:
        if not self._writable:
            return
        sealed = self._cipher.seal(payload, self.identity + key)
        path = self._path(owner, name)
        temporary = path.with_name(f"{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        for attempt in range(2):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(temporary, "wb") as f:
                    f.write(sealed)
                os.replace(temporary, path)
                break
            except FileNotFoundError as exc:  # the directory went away: make it once more
                if attempt:
                    self._turn_off_writes(exc)
                    return
            except OSError as exc:
                _unlink(temporary)
                self._turn_off_writes(exc)
                return
        with self._lock:
            self._drop(name)
            self._add(name, _File(owner, len(sealed)))
            self.blocks_written += 1
            evicted = self._over_budget()
        for path in evicted:
            _unlink(path)

    def _turn_off_writes(self, exc: Exception) -> None:
        with self._lock:
            if not self._writable:
                return
            self._writable = False
        what: object = exc
        if isinstance(exc, OSError):
            code = errno.errorcode.get(exc.errno or 0, "")
            what = f"{exc.strerror or exc}{', ' + code if code else ''}"
        logger.warning("KV disk tier: writing to %s failed (%s); no more blocks are saved "
                       "this run, the ones there are still read, and serving goes on",
                       self.root, what)

    def _over_budget(self) -> list[Path]:
        """Drop least recently used files until the tier fits its budget (lock held); the
        paths to unlink."""
        paths = []
        while self._bytes_used > self.capacity_bytes and self._files:
            name = next(iter(self._files))
            file = self._drop(name)
            assert file is not None
            paths.append(self._path(file.owner, name))
        return paths

    def _add(self, name: str, file: _File) -> None:
        """Index a file (lock held), most recently used."""
        self._files[name] = file
        self._bytes_used += file.size
        self._owner_bytes[file.owner] = self._owner_bytes.get(file.owner, 0) + file.size

    def _drop(self, name: str) -> _File | None:
        """Unindex a file (lock held); the file, if it was there."""
        file = self._files.pop(name, None)
        if file is not None:
            self._bytes_used -= file.size
            left = self._owner_bytes[file.owner] - file.size
            if left:
                self._owner_bytes[file.owner] = left
            else:
                del self._owner_bytes[file.owner]
        return file

    def _enforce_budget(self) -> None:
        with self._lock:
            evicted = self._over_budget()
        for path in evicted:
            _unlink(path)

    def _expire(self) -> None:
        """Remove the files not used within the retention time."""
        if self.ttl_seconds is None:
            return
        cutoff = time.time() - self.ttl_seconds
        gone = 0
        for owner in _subdirs(self.model_dir):
            for entry in _entries(owner):
                try:
                    old = entry.stat().st_mtime < cutoff
                except OSError:
                    continue
                if old and entry.name.endswith(SUFFIX):
                    self._forget(entry.name[:-len(SUFFIX)])
                    _unlink(Path(entry.path))
                    gone += 1
        if gone:
            logger.info("KV disk tier: %d blocks past the retention time (%.0f s) removed",
                        gone, self.ttl_seconds)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._drop(name)

    # -- reading -------------------------------------------------------------------------
    def fetch(self, request_id: str, keys: Sequence[bytes],
              block_ids: Sequence[int]) -> list[bool] | None:
        """See LowerTier: the reader threads read the blocks straight into the pool."""
        if self._place is None:
            raise RuntimeError("this disk tier has no pool to copy blocks into")
        with self._lock:
            reads = self._reads.get(request_id)
            if reads is not None:
                if reads.pending:
                    return None
                return [reads.copied.get(key, False) for key in keys]
            reads = self._reads[request_id] = _Reads(dict(zip(keys, block_ids, strict=True)),
                                                     set(keys))
        # A share per reader, each copying runs of its blocks into the pool.
        share = -(-len(keys) // READER_THREADS)
        for i in range(0, len(keys), share):
            self._read_queue.put((request_id, reads, list(keys[i:i + share])))
        return None

    def release(self, request_id: str) -> None:
        """See LowerTier: waits for a copy into the request's blocks under way (one run)."""
        with self._lock:
            reads = self._reads.pop(request_id, None)
        if reads is not None:
            with reads.placing:
                reads.cancelled = True

    def read_seconds(self, num_blocks: int) -> float | None:
        """What reading this many blocks is expected to take: each reader thread reads its
        share block after block."""
        per_block = self._seconds_per_read
        return None if per_block is None else per_block * -(-num_blocks // READER_THREADS)

    def reading(self) -> bool:
        """Whether some request's blocks are still being read."""
        with self._lock:
            return any(r.pending for r in self._reads.values())

    def wait_for_reads(self, timeout: float) -> None:
        """Block until a read finishes (or `timeout` seconds pass)."""
        self._read_done.wait(timeout)
        self._read_done.clear()

    def _read_loop(self) -> None:
        # This thread's: each file is read into `sealed`, then opened into its place in
        # `run`, which is copied into the pool a run at a time.
        sealed = bytearray(len(MAGIC) + NONCE_BYTES + self.block_bytes + TAG_BYTES)
        per_run = read_run_blocks(self.block_bytes)
        run = memoryview(bytearray(per_run * self.block_bytes))
        while True:
            job = self._read_queue.get()
            if job is None:
                return
            request_id, reads, keys = job
            for start in range(0, len(keys), per_run):
                if reads.cancelled:  # the request went (or came back with reads of its own)
                    break
                chunk = keys[start:start + per_run]
                opened = [self._read_or_miss(key, run[i * self.block_bytes:
                                                      (i + 1) * self.block_bytes], sealed)
                          for i, key in enumerate(chunk)]
                copied = self._copy_run(reads, chunk, opened, run)
                with self._lock:
                    for key, ok in zip(chunk, copied, strict=True):
                        reads.pending.discard(key)
                        reads.copied[key] = ok
                    done = not reads.pending
                if done:  # the engine waits for a request's whole prefix, not block by block
                    self._read_done.set()

    def _read_or_miss(self, key: bytes, out: memoryview, sealed: bytearray) -> bool:
        try:
            return self._read(key, out, sealed)
        except Exception:  # noqa: BLE001 - a bug here must not stop every read
            logger.exception("KV disk tier: reading a block failed: a cache miss")
            self._forget(self._name(key))
            return False

    def _copy_run(self, reads: _Reads, keys: list[bytes], opened: list[bool],
                  run: memoryview) -> list[bool]:
        """Copy the opened blocks of a run into their pool blocks (none for a cancelled
        request); which were copied."""
        assert self._place is not None
        size = self.block_bytes
        ids = [reads.into[k] for k, ok in zip(keys, opened, strict=True) if ok]
        views = [run[i * size:(i + 1) * size] for i, ok in enumerate(opened) if ok]
        with reads.placing:
            if reads.cancelled:
                return [False] * len(keys)
            if ids:
                try:
                    self._place(ids, views)
                except Exception:  # noqa: BLE001 - a miss, not a dead reader
                    logger.exception("KV disk tier: copying blocks into the pool failed: "
                                     "cache misses")
                    return [False] * len(keys)
        return opened

    def _read(self, key: bytes, out: memoryview, sealed: bytearray) -> bool:
        """Read one block's file into `sealed` and open it into `out` (a reader thread's);
        False for a miss."""
        name = self._name(key)
        with self._lock:
            file = self._files.get(name)
        if file is None:
            return False
        path = self._path(file.owner, name)
        started = time.perf_counter()
        try:
            with open(path, "rb", buffering=0) as f:
                size = f.readinto(sealed)
                if f.read(1):
                    raise SealBroken("longer than a sealed block")
            self._cipher.open_into(memoryview(sealed)[:size], self.identity + key, out)
        except (OSError, SealBroken) as exc:
            logger.warning("KV disk tier: block file %s unreadable (%s): a cache miss; "
                           "removed", path.name, exc)
            self._forget(name)
            _unlink(path)
            with self._lock:
                self.blocks_unreadable += 1
            return False
        took = time.perf_counter() - started
        previous = self._seconds_per_read
        self._seconds_per_read = took if previous is None else 0.9 * previous + 0.1 * took
        with self._lock:
            if name in self._files:
                self._files.move_to_end(name)
            self.blocks_read += 1
        try:  # the use outlives a restart: the next run's order comes from the mtimes
            os.utime(path)
        except OSError:
            pass
        return True

    # -- privacy -------------------------------------------------------------------------
    def purge(self, cache_salt: str | None) -> int:
        """Remove every block saved under this prefix-cache salt (of every model in the
        directory); the number of this model's blocks removed."""
        owner = self._owner(cache_salt)
        with self._writing:
            with self._lock:
                self._purged_through[owner] = self._sequence
                mine = [n for n, f in self._files.items() if f.owner == owner]
                for name in mine:
                    self._drop(name)
            purge_owner(self.root, self._cipher, cache_salt)
        return len(mine)

    # -- lifetime ------------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued write is on disk (or `timeout` seconds); whether it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queued:
                    return True
            time.sleep(0.005)
        return False

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to `timeout` seconds), then stop both threads."""
        if self._closed:
            return
        self._closed = True
        self._write_queue.put(None)
        for _ in self._readers:
            self._read_queue.put(None)
        self._writer.join(timeout)
        for reader in self._readers:
            reader.join(timeout)


def kv_disk_owner(secret: bytes, cache_salt: str | None) -> str:
    """The name DiskTierStats.bytes_by_owner gives a prefix-cache salt's blocks (its folder
    in every model's), under the tier's secret."""
    return owner_folder(BlockCipher(secret), cache_salt)


def owner_folder(cipher: BlockCipher, cache_salt: str | None) -> str:
    """The folder a prefix-cache salt's blocks are written under, in every model's."""
    return cipher.name(b"owner", (cache_salt or "").encode())


def purge_kv_disk(root: Path, secret: bytes, cache_salt: str | None) -> None:
    """Remove a prefix-cache salt's blocks from every model's folder of the disk tier in
    `root`, whether or not an engine runs on it (one that does still lists the files, and
    finds each gone: a miss)."""
    purge_owner(Path(root), BlockCipher(secret), cache_salt)


def purge_owner(root: Path, cipher: BlockCipher, cache_salt: str | None) -> None:
    """Remove a salt's blocks from every model's folder under `root`."""
    owner = owner_folder(cipher, cache_salt)
    for model in _subdirs(Path(root)):
        shutil.rmtree(model / owner, ignore_errors=True)


def _subdirs(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _entries(path: Path) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(path) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
