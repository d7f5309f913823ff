"""/admin/users: list (with today's usage), create, disable or re-enable, delete, and forget a
person's cached context (their prefix-cache blocks in every model's pool, RAM tier and on
disk)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Request
from pydantic import BaseModel

from officellm.app.admin.access import admin_actor
from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import UserView, user_view
from officellm.app.db import (
    admin_changes,
    get_user,
    list_usage,
    list_users,
    usage_today,
    utc_today,
)
from officellm.app.db.audit import record_change
from officellm.app.db.users import set_user_disabled, user_info
from officellm.app.errors import APIError
from officellm.app.policy import prefix_cache_salt
from officellm.app.serving.state import ServerState
from officellm.engine import purge_kv_disk

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
        user = admin_changes.create_user(session, admin_actor(request), body.name)
    return user_view(user, None)


@router.patch("/users/{name}")
def patch_user(name: str, body: UserChange, request: Request) -> UserView:
    """Disable (or re-enable) a user: their keys are refused from the next request on."""
    server = _server(request)
    with answered_errors("name"), server.accounts.db.transaction() as session:
        user = admin_changes.set_user_disabled(session, admin_actor(request), name,
                                               body.disabled)
        today = usage_today(session, user.id)
    return user_view(user, today)


class CachePurged(BaseModel):
    """What a purge of a person's cached context removed."""

    user: str
    pool_blocks: int  # cached blocks dropped from the running models' KV pools
    disk_tier: bool  # whether a disk tier's files were removed too (every model's)


@router.post("/users/{name}/purge-cache")
async def purge_user_cache(name: str, request: Request) -> CachePurged:
    """Forget everything cached from this person's prompts: their blocks in every running
    model's prefix cache (its pool and RAM tier) and in the disk tier (sleeping and unloaded
    models' too). Blocks of prompts sent under a policy that shares the prefix cache are
    everyone's, and age out."""
    server = _server(request)
    with answered_errors("name"), server.accounts.db.session() as session:
        user = get_user(session, name)
        user_id, user_name = user.id, user.name
    purged = await _purge(server, user_id, user_name)
    with server.accounts.db.transaction() as session:
        record_change(session, admin_actor(request), "user.purge_cache", user_name, None,
                      purged.model_dump())
    return purged


@router.delete("/users/{name}")
async def remove_user(name: str, request: Request) -> CachePurged:
    """Delete a person: their keys, policy, threads and usage go with them, and everything
    cached from their prompts is purged as by purge-cache. They are disabled first, so no
    request of theirs starts meanwhile; while requests of theirs still run (in this server)
    the answer is a 409, and they stay disabled: delete again once those have finished."""
    server = _server(request)
    actor = admin_actor(request)
    with answered_errors("name"), server.accounts.db.transaction() as session:
        found = user_info(get_user(session, name))
        user = set_user_disabled(session, name, True)
    running = server.admission.concurrency.active(user.id)
    if running:
        # The deletion stops here with the user disabled: that is a change of its own. Not in
        # the disabling's transaction, whose commit is what the running count is read after.
        with server.accounts.db.transaction() as session:
            record_change(session, actor, "user.disable", user.name,
                          admin_changes.user_values(found), admin_changes.user_values(user))
        raise APIError(409, f"user {user.name!r} has {running} request(s) running; they are "
                            "disabled now (no new request starts): delete them again once "
                            "those have finished", param="name", code="requests_running")
    purged = await _purge(server, user.id, user.name)
    with answered_errors("name"), server.accounts.db.transaction() as session:
        admin_changes.delete_user(session, actor, user.id, before=found)
    return purged


async def _purge(server: ServerState, user_id: int, user_name: str) -> CachePurged:
    """Drop the person's cached blocks from every model's pool and RAM tier, and their
    folder from the disk tier (every model's)."""
    salt = prefix_cache_salt(user_id, share_prefix_cache=False)
    dropped = 0
    for model in server.models.models:
        dropped += await model.async_engine.purge_cache_salt(salt)
    engine = server.settings.engine
    on_disk = engine.kv_disk_dir is not None and engine.kv_disk_key is not None
    if on_disk:
        await asyncio.to_thread(purge_kv_disk, Path(str(engine.kv_disk_dir)),
                                bytes(engine.kv_disk_key or b""), salt)
    server.accounts.record_event("cache_purged", user_id, {"pool_blocks": dropped})
    return CachePurged(user=user_name, pool_blocks=dropped, disk_tier=on_disk)
