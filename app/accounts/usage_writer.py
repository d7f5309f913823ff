"""`UsageWriter`: the request path's database writes, batched off the hot path.

Requests only append to in-memory buffers (a dict update under a lock, microseconds); a
background thread writes everything buffered in ONE transaction every `interval` seconds
(default 0.5 s), and close() writes the rest. Updates to the same row are merged in memory
first (usage counters summed, a thread's latest stats kept, a key's latest use kept), so the
database sees one upsert per row per flush whatever the request rate.

Loss bound: a clean close() loses nothing. A crash (SIGKILL, power cut) loses at most what was
buffered since the last flush, i.e. about one interval of usage, thread stats, last_used times
and events; every committed flush survives (WAL, synchronous=FULL), and the rest of the
database (users, keys, policies) is never touched by the writer at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from functools import partial
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from officellm.app.db.column_types import utcnow
from officellm.app.db.database import Database
from officellm.app.db.events import record_event
from officellm.app.db.keys import touch_keys
from officellm.app.db.records import UsageCounts
from officellm.app.db.threads import record_thread
from officellm.app.db.usage import (
    add_usage,
    audio_seconds_on,
    usage_model_name,
    usage_on,
    utc_today,
)

log = logging.getLogger(__name__)

# How often the buffered usage is committed: also the most a crash can lose (docs/security.md).
FLUSH_INTERVAL_S = 0.5


@dataclass
class _ThreadUpdate:
    turns: int
    prompt_tokens: int
    completion_tokens: int
    first_seen: datetime
    last_seen: datetime


@dataclass
class _Batch:
    usage: dict[tuple[int, date, str], UsageCounts]  # (user id, day, model)
    threads: dict[tuple[int, str], _ThreadUpdate]
    keys: dict[int, datetime]
    events: list[tuple[str, int | None, Any, datetime]]

    @classmethod
    def empty(cls) -> _Batch:
        return cls({}, {}, {}, [])

    def __bool__(self) -> bool:
        return bool(self.usage or self.threads or self.keys or self.events)

    def merge_older(self, older: _Batch) -> None:
        """Fold a batch taken *before* this one back in (after a failed flush)."""
        for k, d in older.usage.items():
            self.usage[k] = self.usage.get(k, UsageCounts()) + d
        for k, t in older.threads.items():
            if k in self.threads:
                self.threads[k].first_seen = min(self.threads[k].first_seen, t.first_seen)
            else:
                self.threads[k] = t
        for k, when in older.keys.items():
            self.keys[k] = max(when, self.keys.get(k, when))
        self.events[:0] = older.events


class UsageWriter:
    """Buffers usage, thread stats, key last_used and events; flushes them in one transaction
    every `interval` seconds on a background thread, and on flush() / close()."""

    def __init__(self, db: Database, interval: float = FLUSH_INTERVAL_S,
                 start: bool = True) -> None:
        self.db = db
        self.interval = interval
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time (timer vs. explicit flush)
        self._batch = _Batch.empty()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.failed_flushes = 0
        self.dropped = 0  # updates refused by the database (integrity errors), logged
        if start:
            self.start()

    # -- the request path: memory only ---------------------------------------------------

    def add_usage(self, user_id: int, prompt_tokens: int, completion_tokens: int,
                  requests: int = 1, day: date | None = None, *, model: str = "",
                  cached_tokens: int = 0, busy_seconds: float = 0.0, embedding: bool = False,
                  task: bool = False, images: int = 0, audio_seconds: float | None = None,
                  rerank: bool = False) -> None:
        """Count a finished request against the user's day (UTC) under the served `model`.
        `embedding` (an /v1/embeddings request) and `task` (a front end's background task,
        app/policy/background_tasks.py) count it in those columns besides the totals, which
        the daily quota reads; so do `rerank` (a rerank or score request) and a transcription
        (`audio_seconds` given: the seconds of audio it read). `images`: the images in a chat."""
        tokens = prompt_tokens + completion_tokens
        delta = UsageCounts(
            requests=requests, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
            embedding_requests=requests if embedding else 0,
            embedding_tokens=tokens if embedding else 0,
            task_requests=requests if task else 0, task_tokens=tokens if task else 0,
            busy_seconds=busy_seconds, images=images,
            audio_requests=requests if audio_seconds is not None else 0,
            audio_seconds=audio_seconds or 0.0,
            rerank_requests=requests if rerank else 0, rerank_tokens=tokens if rerank else 0)
        key = (user_id, day or utc_today(), usage_model_name(model))
        with self._lock:
            self._check_open()
            self._batch.usage[key] = self._batch.usage.get(key, UsageCounts()) + delta

    def record_thread(self, user_id: int, thread_key: str, turns: int, prompt_tokens: int,
                      completion_tokens: int, seen: datetime | None = None) -> None:
        """Note a thread's latest request (turns and tokens replace the previous ones)."""
        seen = seen or utcnow()
        with self._lock:
            self._check_open()
            old = self._batch.threads.get((user_id, thread_key))
            first = min(old.first_seen, seen) if old is not None else seen
            self._batch.threads[(user_id, thread_key)] = _ThreadUpdate(
                turns, prompt_tokens, completion_tokens, first, seen)

    def touch_key(self, key_id: int, when: datetime | None = None) -> None:
        """Note that an API key was used (its last_used column)."""
        when = when or utcnow()
        with self._lock:
            self._check_open()
            self._batch.keys[key_id] = max(when, self._batch.keys.get(key_id, when))

    def record_event(self, kind: str, user_id: int | None = None, detail: Any = None,
                     time: datetime | None = None) -> None:
        """Queue an event (a refusal, a truncation, a preemption...)."""
        with self._lock:
            self._check_open()
            self._batch.events.append((kind, user_id, detail, time or utcnow()))

    def pending_tokens(self, user_id: int, day: date | None = None) -> int:
        """Tokens counted for the user's day, every model, but not yet written (add to
        usage_today())."""
        day = day or utc_today()
        with self._lock:
            return sum(d.total_tokens for (uid, d_day, _), d in self._batch.usage.items()
                       if uid == user_id and d_day == day)

    def tokens_today(self, user_id: int) -> int:
        """The user's tokens today, committed plus still queued: what max_tokens_per_day is
        checked against. Waits for a flush in progress (milliseconds) so nothing is counted
        twice or missed."""
        day = utc_today()
        with self._flush_lock:
            with self.db.session() as session:
                committed = usage_on(session, user_id, day).total_tokens
            return committed + self.pending_tokens(user_id, day)

    def audio_seconds_today(self, user_id: int) -> float:
        """The user's seconds of audio today, committed plus still queued: what a policy's
        audio_minutes_per_day is checked against."""
        day = utc_today()
        with self._flush_lock:
            with self.db.session() as session:
                committed = audio_seconds_on(session, user_id, day)
            with self._lock:
                pending = sum(d.audio_seconds for (uid, d_day, _), d in self._batch.usage.items()
                              if uid == user_id and d_day == day)
            return committed + pending

    # -- the background side ---------------------------------------------------------

    def start(self) -> None:
        """Start the flushing thread (done by the constructor unless start=False)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="officellm-usage-writer",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> bool:
        """Write everything buffered now, in one transaction. False if the write failed (the
        updates are then kept and retried at the next flush)."""
        with self._flush_lock:
            with self._lock:
                batch, self._batch = self._batch, _Batch.empty()
            if not batch:
                return True
            try:
                try:
                    self._write(batch, isolate=False)
                except IntegrityError:
                    # One bad update (e.g. a user id that does not exist) must not block the
                    # others forever: write each in its own savepoint and drop the bad ones.
                    self._write(batch, isolate=True)
            except Exception:
                # A locked or full disk must not lose the counts: put them back for next time.
                log.exception("usage flush failed; retrying at the next interval")
                with self._lock:
                    self._batch.merge_older(batch)
                self.failed_flushes += 1
                return False
            self.flushes += 1
            return True

    def _write(self, batch: _Batch, isolate: bool) -> None:
        ops: list[tuple[str, Callable[[Session], None]]] = []
        for (user_id, day, model), d in batch.usage.items():
            ops.append((f"usage {user_id} {day} {model!r}", partial(
                add_usage, user_id=user_id, day=day, model=model, counts=d)))
        for (user_id, key), t in batch.threads.items():
            ops.append((f"thread {user_id} {key}", partial(
                record_thread, user_id=user_id, thread_key=key, turns=t.turns,
                prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
                seen=t.last_seen, first_seen=t.first_seen)))
        if batch.keys:
            ops.append(("key last_used", partial(touch_keys, last_used=batch.keys)))
        for kind, user_id, detail, time in batch.events:
            ops.append((f"event {kind}", partial(record_event, kind=kind, user_id=user_id,
                                                 detail=detail, time=time)))
        with self.db.transaction() as session:
            for what, op in ops:
                if not isolate:
                    op(session)
                    continue
                try:
                    with session.begin_nested():
                        op(session)
                except IntegrityError as exc:
                    self.dropped += 1
                    log.error("usage writer dropped %s: %s", what, exc.orig)

    def close(self) -> None:
        """Stop the thread and write what is left; nothing enqueued before close() is lost."""
        with self._lock:  # enqueues hold this lock: each lands before close() or is refused
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.flush():
            raise RuntimeError("could not write the last usage batch; see the log")

    def _check_open(self) -> None:  # called with self._lock held
        if self._closed:
            raise RuntimeError("UsageWriter is closed")

    def __enter__(self) -> UsageWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
