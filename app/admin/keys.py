"""/admin/keys: list, issue (the raw key is in this one answer and nowhere else), revoke.

A front-end key (`forwarded_users`) speaks for other people (docs/design.md §5); its
`jwt_secret`, if given, is kept in a private file beside the database, never in it, and never
answered back (app/db/jwt_secrets.py)."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from officellm.app.admin.access import admin_actor
from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import IssuedKeyView, KeyView, issued_key_view, key_view
from officellm.app.db import admin_changes, list_keys
from officellm.app.serving.state import ServerState

router = APIRouter()

# SQLite's largest integer: a larger id cannot be bound at all (found by fuzzing: a 500).
MAX_KEY_ID = 2**63 - 1


class NewKey(BaseModel):
    user: str
    forwarded_users: bool = Field(
        False, description="A front-end key (Open WebUI, ...): trusted to say which person "
                           "each request is for.")
    jwt_secret: str | None = Field(
        None, description="Front-end keys only: the HS256 secret the front end signs its "
                          "X-OpenWebUI-User-Jwt with (at least 32 characters); then every "
                          "request must carry a valid one.")


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
    db = _server(request).accounts.db
    with answered_errors("user"), db.transaction() as session:
        issued = admin_changes.issue_key(session, admin_actor(request), body.user, forwarded_users=body.forwarded_users,
                           jwt_secret=body.jwt_secret, secrets=db.jwt_secrets)
    return issued_key_view(issued)


@router.delete("/keys/{key_id}")
def delete_key(request: Request, key_id: int = Path(ge=1, le=MAX_KEY_ID)) -> KeyView:
    """Revoke: the key is refused from the next request on (the record stays, for audit)."""
    db = _server(request).accounts.db
    with answered_errors("id"), db.transaction() as session:
        return key_view(admin_changes.revoke_key(session, admin_actor(request), key_id,
                                                 secrets=db.jwt_secrets))
