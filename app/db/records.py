"""Plain, session-free views of rows: what the repository functions hand back to the server."""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass
from datetime import date, datetime
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (timestamps as ISO 8601 strings)."""
        return {k: _jsonable(v) for k, v in asdict(self).items()}  # type: ignore[call-overload]


@dataclass(frozen=True)
class UserInfo(_Record):
    id: int
    name: str
    disabled: bool
    created: datetime
    via: str | None = None  # the front end this person came through (its user's name)


@dataclass(frozen=True)
class KeyInfo(_Record):
    id: int
    user_id: int
    user_name: str
    prefix: str
    created: datetime
    last_used: datetime | None
    revoked: bool
    forwarded_users: bool = False  # a front-end key: speaks for other people
    jwt_secret: bool = False  # its people come in a JWT checked with a secret (never shown)


@dataclass(frozen=True)
class IssuedKey:
    """A new key: `raw` is shown to the admin once and never stored."""

    raw: str
    info: KeyInfo


@dataclass(frozen=True)
class AuthenticatedUser(_Record):
    """Who a valid key belongs to; `key_id` is for the batched last_used update. A front-end
    key (`forwarded_users`) may speak for other people; with `jwt_secret_hash` it must, in a
    JWT signed with the secret that fingerprint was made from, which `jwt_secret_sealed`
    holds (app/db/jwt_secrets.py)."""

    user_id: int
    name: str
    key_id: int
    forwarded_users: bool = False
    jwt_secret_hash: str | None = None
    jwt_secret_sealed: str | None = None


@dataclass(frozen=True)
class ThreadInfo(_Record):
    id: int
    user_id: int
    user_name: str
    thread_key: str
    turns: int
    last_prompt_tokens: int
    last_completion_tokens: int
    first_seen: datetime
    last_seen: datetime

    @property
    def length(self) -> int:
        """docs/design.md §6: a thread's length is its latest prompt plus completion."""
        return self.last_prompt_tokens + self.last_completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "length": self.length}


@dataclass(frozen=True)
class UsageDay(_Record):
    """A user's one UTC day over every model: what max_tokens_per_day is checked against."""

    user_id: int
    day: date
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class UsageCounts(_Record):
    """The counters of one usage row, or of a sum of rows (docs/admin_api.md, GET
    /admin/usage): `requests`, `prompt_tokens` and `completion_tokens` include the embeddings
    and background tasks that `embedding_*` and `task_*` count apart, and the transcriptions and
    rerankings that `audio_*` and `rerank_*` count apart."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    embedding_requests: int = 0
    embedding_tokens: int = 0
    task_requests: int = 0
    task_tokens: int = 0
    busy_seconds: float = 0.0
    images: int = 0  # images in chat requests (their tokens are in prompt_tokens)
    audio_requests: int = 0
    audio_seconds: float = 0.0  # seconds of audio transcribed or translated
    rerank_requests: int = 0
    rerank_tokens: int = 0

    def __add__(self, other: UsageCounts) -> UsageCounts:
        return UsageCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class UsageReportRow(_Record):
    """One group of a usage report: the user, the model or the day it is for (the other two
    None), and its counters summed."""

    user: str | None
    model: str | None
    day: date | None
    counts: UsageCounts


@dataclass(frozen=True)
class EventInfo(_Record):
    id: int
    time: datetime
    kind: str
    user_id: int | None
    detail: Any


@dataclass(frozen=True)
class ReplicaInfo(_Record):
    """A replica as the admin API lists it: `heartbeat_age_s` when listed, `stale` when it
    has missed its heartbeats (stopped, killed or cut off)."""

    name: str
    url: str
    model: str | None
    started: datetime
    heartbeat: datetime
    draining: bool
    heartbeat_age_s: float
    stale: bool


@dataclass(frozen=True)
class AuditEntry(_Record):
    """One row of the audit log (app/db/audit.py): `actor` made the change `action` to
    `target`; `before` and `after` are the changed thing's values (None: it did not exist)."""

    id: int
    time: datetime
    actor: str
    action: str
    target: str
    before: Any
    after: Any
