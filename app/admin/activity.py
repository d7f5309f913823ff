"""/admin/threads, /admin/events: what the users did (never what they wrote); /admin/usage is
app/admin/usage.py."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session

from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import (
    EventView,
    ThreadView,
    event_view,
    thread_view,
)
from officellm.app.db import (
    ThreadInfo,
    get_effective_policy,
    list_threads,
    list_users,
    recent_events,
)
from officellm.app.db.column_types import utcnow
from officellm.app.serving.state import ServerState

router = APIRouter()

MAX_THREADS = 1000
# Ten years; beyond it a timedelta overflows (found by fuzzing).
MAX_ACTIVE_MINUTES = 3660 * 24 * 60


def _server(request: Request) -> ServerState:
    return request.app.state.server


def thread_caps(server: ServerState, session: Session, threads: list[ThreadInfo]) -> dict[int, int | None]:
    """Each thread owner's effective cap (their policy's and the server's, the lower)."""
    return {uid: server.default_model.context_cap(get_effective_policy(session, uid).max_context_tokens)
            for uid in {t.user_id for t in threads}}


def threads_with_caps(server: ServerState, session: Session, user: str | None = None,
                      active_minutes: float | None = None) -> list[ThreadView]:
    """Threads as docs/admin_api.md shows them, longest first."""
    since = utcnow() - timedelta(minutes=active_minutes) if active_minutes is not None else None
    threads = list_threads(session, user, seen_since=since, limit=MAX_THREADS)
    caps = thread_caps(server, session, threads)
    threads.sort(key=lambda t: (-t.length, -t.last_seen.timestamp()))
    return [thread_view(t, caps[t.user_id]) for t in threads]


@router.get("/threads")
def get_threads(request: Request, user: str | None = None,
                active_minutes: float | None = Query(None, gt=0, le=MAX_ACTIVE_MINUTES),
                ) -> list[ThreadView]:
    server = _server(request)
    server.accounts.writer.flush()  # include the request answered a moment ago
    with answered_errors("user"), server.accounts.db.session() as session:
        return threads_with_caps(server, session, user, active_minutes)


@router.get("/events")
def get_events(request: Request, limit: int = Query(100, ge=1, le=10_000),
               kind: str | None = None) -> list[EventView]:
    """Newest first: refusals, truncations, preemptions, and the admin's own changes."""
    server = _server(request)
    server.accounts.writer.flush()
    with server.accounts.db.session() as session:
        names = {u.id: u.name for u in list_users(session)}
        events = recent_events(session, limit=limit, kind=kind)
    return [event_view(e, names.get(e.user_id) if e.user_id is not None else None)
            for e in events]
