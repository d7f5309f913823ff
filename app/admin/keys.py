"""/admin/keys: list, issue (the raw key is in this one answer and nowhere else), revoke."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel

from app.admin.errors import answered_errors
from app.admin.views import IssuedKeyView, KeyView, issued_key_view, key_view
from app.db import issue_key, list_keys, revoke_key
from app.serving.state import ServerState

router = APIRouter()

# SQLite's largest integer: a larger id cannot be bound at all (found by fuzzing: a 500).
MAX_KEY_ID = 2**63 - 1


class NewKey(BaseModel):
    user: str


def _server(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/keys")
def get_keys(request: Request, user: str | None = None) -> list[KeyView]:
    server = _server(request)
    server.accounts.writer.flush()  # last_used of keys used a moment ago
    with answered_errors("user"), server.accounts.db.session() as session:
        return [key_view(k) for k in list_keys(session, user)]


@router.post("/keys", status_code=201)
def post_key(body: NewKey, request: Request) -> IssuedKeyView:
    with answered_errors("user"), _server(request).accounts.db.transaction() as session:
        issued = issue_key(session, body.user)
    return issued_key_view(issued)


@router.delete("/keys/{key_id}")
def delete_key(request: Request, key_id: int = Path(ge=1, le=MAX_KEY_ID)) -> KeyView:
    """Revoke: the key is refused from the next request on (the record stays, for audit)."""
    with answered_errors("id"), _server(request).accounts.db.transaction() as session:
        return key_view(revoke_key(session, key_id))
