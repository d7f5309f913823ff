"""/admin/audit: the audit log (app/db/audit.py), newest first, and which admin routes change
nothing (READ_ONLY_ROUTES): every other route writes one audit row per change it makes
(tests/server/test_admin_audit.py calls each route and holds both to that)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from officellm.app.admin.views import Timestamp
from officellm.app.db.audit import AuditQuery, audit_entries
from officellm.app.serving.state import ServerState

router = APIRouter()

MAX_ROWS = 10_000

# The admin routes that change nothing, so write no audit row: "METHOD /admin/path" as the
# app declares them. A new route is either here or records its changes (app/db/audit.py).
READ_ONLY_ROUTES = frozenset({
    "GET /admin/stats",
    "GET /admin/plan",
    "POST /admin/plan",  # a what-if: computes a plan, stores nothing
    "GET /admin/users",
    "GET /admin/keys",
    "GET /admin/policies",
    "GET /admin/threads",
    "GET /admin/usage",
    "GET /admin/events",
    "GET /admin/replicas",
    "GET /admin/models",
    "GET /admin/audit",
})


class AuditRow(BaseModel):
    id: int
    time: Timestamp
    actor: str = Field(description="Who: admin-token, console:USER or cli:USER (USER: the "
                                   "operating-system user the console or CLI ran as).")
    action: str = Field(description="What, e.g. user.create, key.revoke, policy.set, "
                                    "model.load.")
    target: str = Field(description="The user's or model's name, the key's id, or default "
                                    "(the default policy).")
    before: Any = Field(description="The changed thing's values before (null: it did not "
                                    "exist); never a key, token or hash.")
    after: Any = Field(description="Its values after (null: it no longer exists).")


@router.get("/audit")
def get_audit(request: Request,
              since: datetime | None = Query(None, description="From this time on (ISO 8601; "
                                                                "UTC if no zone)."),
              until: datetime | None = Query(None, description="Before this time."),
              actor: str | None = Query(None, max_length=128,
                                        description="One actor (cli:alice), or every actor "
                                                    "of a kind (cli, console)."),
              action: str | None = Query(None, max_length=64),
              limit: int = Query(100, ge=1, le=MAX_ROWS)) -> list[AuditRow]:
    """The admin's changes, newest first."""
    server: ServerState = request.app.state.server
    query = AuditQuery(since=since, until=until, actor=actor, action=action, limit=limit)
    with server.accounts.db.session() as session:
        return [AuditRow(**{**e.to_dict(), "time": e.time.isoformat()})
                for e in audit_entries(session, query)]
