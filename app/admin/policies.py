"""/admin/policies: the default row and per-user overrides. Changes apply to the next request
(the chat route reads the policy per request)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from officellm.app.admin.access import admin_actor
from officellm.app.admin.errors import answered_errors
from officellm.app.admin.views import PolicyList, PolicyView, policy_view
from officellm.app.db import admin_changes, get_policy, get_user
from officellm.app.db.policies import (
    INT_FIELDS,
    KV_SHARE_RANGE,
    LIMIT_RANGE,
    MODEL_NAME_MAX,
    list_policy_overrides,
    validate_policy_fields,
)
from officellm.app.db.tables import ON_LIMIT_CHOICES
from officellm.app.errors import APIError
from officellm.app.policy.scheduling import PRIORITY_CHOICES
from officellm.app.serving.state import ServerState

router = APIRouter()


def policy_body(is_default: bool) -> dict[str, Any]:
    """openapi_extra: the PUT body's schema, told from the data layer's rules (checked by
    validate_policy_fields, once, with a message naming the field). Any subset of the fields;
    null clears one, except the default's on_limit, share_prefix_cache and priority."""
    lo, hi = LIMIT_RANGE
    # The top as exclusiveMaximum: the schema's numbers pass through floats, and
    # float(2**63 - 1) is 2**63.
    limit = {"type": "integer", "minimum": lo, "exclusiveMaximum": hi + 1}
    on_limit = {"type": "string", "enum": list(ON_LIMIT_CHOICES)}
    share = {"type": "boolean"}
    priority = {"type": "string", "enum": list(PRIORITY_CHOICES)}
    kv_share = {"type": "number", "exclusiveMinimum": KV_SHARE_RANGE[0],
                "maximum": KV_SHARE_RANGE[1]}
    null = {"type": "null"}
    props: dict[str, Any] = {name: {"anyOf": [limit, null]} for name in INT_FIELDS}
    props["on_limit"] = on_limit if is_default else {"anyOf": [on_limit, null]}
    props["share_prefix_cache"] = share if is_default else {"anyOf": [share, null]}
    props["priority"] = priority if is_default else {"anyOf": [priority, null]}
    props["max_kv_share"] = {"anyOf": [kv_share, null]}
    # Names without spaces too: told by validate_policy_fields, not a pattern that JSON
    # Schema's and Python's regexes would read differently.
    model_name = {"type": "string", "minLength": 1, "maxLength": MODEL_NAME_MAX}
    props["models"] = {"anyOf": [{"type": "array", "items": model_name}, null]}
    schema = {"type": "object", "properties": props, "additionalProperties": False,
              "title": "DefaultPolicyUpdate" if is_default else "UserPolicyUpdate"}
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}


def _server(request: Request) -> ServerState:
    return request.app.state.server


def _validated(values: Any, is_default: bool) -> dict[str, Any]:
    """The body's fields, or 400 naming the first bad one (param = the field)."""
    if not isinstance(values, dict):
        raise APIError(400, "The body must be a JSON object of policy fields.")
    for name, value in values.items():
        try:
            validate_policy_fields({name: value}, is_default)
        except ValueError as exc:
            raise APIError(400, str(exc), param=name) from exc
    return values


@router.get("/policies")
def get_policies(request: Request) -> PolicyList:
    with _server(request).accounts.db.session() as session:
        default = get_policy(session, None)
        users = {name: policy_view(p) for name, p in list_policy_overrides(session).items()}
    return PolicyList(default=policy_view(default), users=users)


@router.put("/policies/default", openapi_extra=policy_body(is_default=True))
def put_default(request: Request, values: Any = Body(...)) -> PolicyView:
    """Set the given fields of the default policy (fields not in the body stay as they are;
    null means no limit)."""
    values = _validated(values, is_default=True)
    with _server(request).accounts.db.transaction() as session:
        return policy_view(admin_changes.set_policy(session, admin_actor(request), None,
                                                    **values))


@router.put("/policies/users/{name}", openapi_extra=policy_body(is_default=False))
def put_user(name: str, request: Request, values: Any = Body(...)) -> PolicyView:
    """Set the given fields of a user's override (null: inherit the default)."""
    values = _validated(values, is_default=False)
    with answered_errors("name"), _server(request).accounts.db.transaction() as session:
        return policy_view(admin_changes.set_policy(session, admin_actor(request), name,
                                                    **values))


@router.delete("/policies/users/{name}", status_code=204)
def delete_user(name: str, request: Request) -> Response:
    with answered_errors("name"), _server(request).accounts.db.transaction() as session:
        get_user(session, name)  # 404 for an unknown user; no override is fine
        admin_changes.clear_policy(session, admin_actor(request), name)
    return Response(status_code=204)
