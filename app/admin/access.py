"""Who may use /admin: loopback clients (unless --admin-remote) holding the admin token.

The admin token's hash lives in the settings table; it is compared in constant time
(verify_admin_token). A valid *user* key is a real identity without admin rights: 403, not 401.

Who made a change, for the audit log (admin_actor): the admin token is the only proof, so a
call is "admin-token" unless its client says more in the X-Officellm-Client header
("console:alice", "cli:alice": which program, and the operating-system user running it).
That part is the caller's word, recorded as given by a holder of the admin token.
"""

from __future__ import annotations

import ipaddress
import re

from fastapi import Request

from officellm.app.admission.auth import (
    Authenticator,
    bearer_token,
    check_throttle,
    record_auth_failure,
)
from officellm.app.db import verify_admin_token
from officellm.app.db.audit import ADMIN_TOKEN_ACTOR
from officellm.app.errors import APIError
from officellm.app.serving.state import ServerState

# Which admin client made a call, and as which OS user (docs/admin_api.md "Who made a change").
CLIENT_HEADER = "X-Officellm-Client"
_CLIENT_VALUE = re.compile(r"(console|cli):[^\x00-\x1f\x7f]{1,64}")


def admin_actor(request: Request) -> str:
    """Who the audit log says made this admin call: the client's "console:USER" or
    "cli:USER" when it sent a well-formed X-Officellm-Client, else "admin-token"."""
    said = request.headers.get(CLIENT_HEADER, "")
    return said if _CLIENT_VALUE.fullmatch(said) else ADMIN_TOKEN_ACTOR


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and ::ffff:127.x (IPv4 loopback seen through IPv6)."""
    if not host:
        return False
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def require_admin(request: Request) -> None:
    """FastAPI dependency (sync: runs on a worker thread): 403 for a remote client without
    --admin-remote or for a user key, 401 for no token or a wrong one."""
    server: ServerState = request.app.state.server
    client = request.client.host if request.client else None
    if not server.settings.admin_remote and not is_loopback(client):
        raise APIError(403, "The admin API answers only on this machine; start the server with "
                            "--admin-remote to allow other machines.", code="admin_local_only")
    check_throttle(request)
    token = bearer_token(request)
    if token is None:
        raise APIError(401, "The admin API needs the admin token: send 'Authorization: Bearer "
                            "<token>' (the token is in the admin_token file beside the "
                            "database).", code="invalid_admin_token",
                       headers={"WWW-Authenticate": "Bearer"})
    with server.accounts.db.session() as session:
        if verify_admin_token(session, token):
            return
    authenticator: Authenticator = request.app.state.authenticator
    principal = authenticator.authenticate(token)
    if principal is not None and not principal.anonymous:
        raise APIError(403, "This is a user key; the admin API needs the admin token.",
                       code="not_admin")
    record_auth_failure(request)
    raise APIError(401, "Incorrect admin token.", code="invalid_admin_token",
                   headers={"WWW-Authenticate": "Bearer"})
