"""`Accounts`: the server's handle on the database — the file and the batched writer — and
the few writes the request path makes.

Request handlers never write to SQLite themselves: they hand usage, thread statistics, key
use and events to the UsageWriter (memory only; a background thread commits them in batches).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from officellm.app.accounts.usage_writer import FLUSH_INTERVAL_S, UsageWriter
from officellm.app.db import Database, get_effective_policy

logger = logging.getLogger("officellm.server")


@dataclass
class Accounts:
    """One app's database side. `owns_db`: close the Database when the app stops."""

    db: Database
    writer: UsageWriter
    owns_db: bool = False

    @classmethod
    def open(cls, db: Database, owns_db: bool = False, flush_interval: float = FLUSH_INTERVAL_S) -> Accounts:
        """Accounts over an upgraded database; the writer starts with start()."""
        return cls(db, UsageWriter(db, interval=flush_interval, start=False), owns_db=owns_db)

    def start(self) -> None:
        self.writer.start()

    def close(self) -> None:
        """Write everything still queued (a clean stop loses nothing), then close the file."""
        try:
            self.writer.close()
        finally:
            if self.owns_db:
                self.db.close()

    # -- the request path's writes (memory only) --------------------------------------------
    def touch_key(self, key_id: int) -> None:
        self._safely(self.writer.touch_key, key_id)

    def record_event(self, kind: str, user_id: int | None, detail: Any = None) -> None:
        self._safely(self.writer.record_event, kind, user_id, detail)

    def record_request(self, user_id: int, prompt_tokens: int, completion_tokens: int,
                       thread_key: str | None, turns: int | None,
                       thread_completion_tokens: int | None = None, *, model: str,
                       cached_tokens: int = 0, busy_seconds: float = 0.0,
                       task: str | None = None, images: int = 0) -> None:
        """A served generation request under the served `model`: its usage, and (chat) its
        thread's latest size. `task`: the front end's background task it was
        (app/policy/background_tasks.py), None for a person's own request; a task is the
        person's usage all the same, and the usage table counts it apart too."""
        self._safely(self.writer.add_usage, user_id, prompt_tokens, completion_tokens,
                     model=model, cached_tokens=cached_tokens, busy_seconds=busy_seconds,
                     task=task is not None, images=images)
        if thread_key is not None:
            self._safely(self.writer.record_thread, user_id, thread_key, turns or 0, prompt_tokens,
                         completion_tokens if thread_completion_tokens is None
                         else thread_completion_tokens)

    def record_embeddings(self, user_id: int, model: str, tokens: int,
                          busy_seconds: float) -> None:
        """A served /v1/embeddings request: its input tokens count as prompt tokens."""
        self._safely(self.writer.add_usage, user_id, tokens, 0, model=model,
                     busy_seconds=busy_seconds, embedding=True)

    def record_transcription(self, user_id: int, model: str, audio_seconds: float,
                             completion_tokens: int, busy_seconds: float) -> None:
        """A served transcription or translation: its audio's seconds, its text's tokens."""
        self._safely(self.writer.add_usage, user_id, 0, completion_tokens, model=model,
                     busy_seconds=busy_seconds, audio_seconds=audio_seconds)

    def audio_today(self, user_id: int) -> tuple[float, int | None]:
        """The user's seconds of audio today and their policy's audio_minutes_per_day
        (None: no limit), read now (a policy changed applies to the next request)."""
        with self.db.session() as session:
            limit = get_effective_policy(session, user_id).audio_minutes_per_day
        return (self.writer.audio_seconds_today(user_id) if limit is not None else 0.0), limit

    def record_rerank(self, user_id: int, model: str, tokens: int, busy_seconds: float) -> None:
        """A served rerank or score request: the tokens of its query-document pairs count as
        prompt tokens."""
        self._safely(self.writer.add_usage, user_id, tokens, 0, model=model,
                     busy_seconds=busy_seconds, rerank=True)

    def _safely(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except RuntimeError as exc:  # closed: a request outlived the shutdown timeout
            logger.warning("not recorded (%s): %s", fn.__name__, exc)
