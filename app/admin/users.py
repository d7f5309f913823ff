"""/admin/users: list (with today's usage), create, disable or re-enable."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import UserView, user_view
from officellm.app.db import (
    create_user,
    list_usage,
    list_users,
    set_user_disabled,
    usage_today,
    utc_today,
)
from officellm.app.serving.state import ServerState

router = APIRouter()


class NewUser(BaseModel):
    name: str


class UserChange(BaseModel):
    disabled: bool


def _server(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/users")
def get_users(request: Request) -> list[UserView]:
    server = _server(request)
    server.accounts.writer.flush()  # today's usage includes the requests just answered
    with server.accounts.db.session() as session:
        today = {u.user_id: u for u in list_usage(session, since=utc_today())}
        return [user_view(u, today.get(u.id)) for u in list_users(session)]


@router.post("/users", status_code=201)
def post_user(body: NewUser, request: Request) -> UserView:
    with answered_errors("name"), _server(request).accounts.db.transaction() as session:
        user = create_user(session, body.name)
    return user_view(user, None)


@router.patch("/users/{name}")
def patch_user(name: str, body: UserChange, request: Request) -> UserView:
    """Disable (or re-enable) a user: their keys are refused from the next request on."""
    server = _server(request)
    with answered_errors("name"), server.accounts.db.transaction() as session:
        user = set_user_disabled(session, name, body.disabled)
        today = usage_today(session, user.id)
    return user_view(user, today)
