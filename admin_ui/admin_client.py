"""The admin API over HTTP (docs/admin_api.md): one method per route, JSON in and out.

Blocking httpx calls: the console runs them on worker threads (admin_ui.workers), never on
the UI thread. Errors come back as AdminError with the server's own sentence, so the UI can
show it as is ("max_context_tokens must be a positive integer", "user bob exists", ...).
"""

from __future__ import annotations

import getpass
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_TIMEOUT_S = 3.0
# A what-if may name a .gguf on the server's machine, whose metadata (a whole vocabulary) the
# server reads before it can answer: seconds, where the other routes take milliseconds.
WHAT_IF_TIMEOUT_S = 30.0
# Loading a model reads its weights and sizes its KV pool before the server answers: up to a
# minute for a large one on a slow disk, so this route waits far longer than the others.
LOAD_TIMEOUT_S = 180.0
# Says to the server which program made a change, and as which OS user, for its audit log
# (docs/admin_api.md "Who made a change"): "console:USER".
CLIENT_HEADER = "X-Officellm-Client"


def console_actor() -> str:
    """console:USER, USER the operating-system user in ASCII ("unknown" where the system
    cannot say)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return "console:" + (user.encode("ascii", "backslashreplace").decode("ascii")[:64]
                         or "unknown")


class AdminError(Exception):
    """The server answered with an error, or did not answer at all (status None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unreachable(self) -> bool:
        return self.status is None


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if "detail" in body:  # FastAPI's own 404/422 shape
            return str(body["detail"])
    return resp.text.strip()


def _model_path(name: str, action: str = "") -> str:
    """/admin/models/{name}[/action], the name quoted: a model's name may hold any character
    but whitespace (a '#' or '?' in it must not end the path)."""
    return f"/admin/models/{quote(name, safe='')}" + (f"/{action}" if action else "")


class AdminClient:
    """A connection to one server's `/admin` routes with one admin token."""

    def __init__(self, base_url: str, token: str | None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout,
                                  headers={CLIENT_HEADER: console_actor()})

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise AdminError(f"cannot reach {self.base_url}: {exc or type(exc).__name__}") from exc
        if resp.status_code >= 400:
            text = _message(resp)
            if resp.status_code == 404 and path.startswith("/admin") and "not found" in text.lower():
                text = (f"{self.base_url} has no admin API at {path} (an officellm server "
                        "older than the console?)")
            raise AdminError(text, resp.status_code)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    # --- live numbers ------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/admin/stats")

    def plan(self) -> dict[str, Any]:
        return self._request("GET", "/admin/plan")

    def replicas(self) -> list[dict[str, Any]]:
        """The servers sharing this one's database (docs/cluster.md)."""
        return self._request("GET", "/admin/replicas")

    def what_if_plan(self, question: dict[str, Any]) -> dict[str, Any]:
        """`officellm plan` on the server for another model or memory size: {"plan", "text"}."""
        return self._request("POST", "/admin/plan", json=question, timeout=WHAT_IF_TIMEOUT_S)

    def threads(self, user: str | None = None, active_minutes: int | None = None) -> list[dict]:
        params: dict[str, Any] = {}
        if user:
            params["user"] = user
        if active_minutes is not None:
            params["active_minutes"] = active_minutes
        return self._request("GET", "/admin/threads", params=params)

    def events(self, limit: int = 50, kind: str | None = None) -> list[dict]:
        params: dict[str, Any] = {"limit": limit}
        if kind:
            params["kind"] = kind
        return self._request("GET", "/admin/events", params=params)

    def usage(self, since: str, until: str, by: str, user: str | None = None,
              model: str | None = None) -> dict[str, Any]:
        """The usage report of the UTC days `since` to `until` (YYYY-MM-DD), grouped `by`
        user, model or day: {"since", "until", "by", "rows", "total"}."""
        params: dict[str, Any] = {"since": since, "until": until, "by": by}
        if user:
            params["user"] = user
        if model:
            params["model"] = model
        return self._request("GET", "/admin/usage", params=params)

    def audit(self, limit: int = 100, actor: str | None = None,
              action: str | None = None) -> list[dict]:
        """The audit log, newest first: {"id", "time", "actor", "action", "target",
        "before", "after"} each."""
        params: dict[str, Any] = {"limit": limit}
        if actor:
            params["actor"] = actor
        if action:
            params["action"] = action
        return self._request("GET", "/admin/audit", params=params)

    # --- users and keys ------------------------------------------------------------------
    def users(self) -> list[dict]:
        return self._request("GET", "/admin/users")

    def create_user(self, name: str) -> dict:
        return self._request("POST", "/admin/users", json={"name": name})

    def set_user_disabled(self, name: str, disabled: bool) -> dict:
        return self._request("PATCH", f"/admin/users/{name}", json={"disabled": disabled})

    def delete_user(self, name: str) -> dict:
        """Delete a user (keys, policy, threads, usage) and purge their cached context:
        {"user", "pool_blocks", "disk_tier"}; a 409 while requests of theirs run."""
        return self._request("DELETE", f"/admin/users/{name}")

    def purge_user_cache(self, name: str) -> dict:
        """Forget everything cached from a user's prompts: {"user", "pool_blocks",
        "disk_tier"}."""
        return self._request("POST", f"/admin/users/{name}/purge-cache")

    def keys(self, user: str | None = None) -> list[dict]:
        return self._request("GET", "/admin/keys", params={"user": user} if user else None)

    def issue_key(self, user: str, forwarded_users: bool = False,
                  jwt_secret: str | None = None) -> dict:
        """A new key (the raw key in this answer only). `forwarded_users`: a front-end key,
        speaking for other people; `jwt_secret`: the HS256 secret of its JWTs."""
        body: dict[str, Any] = {"user": user}
        if forwarded_users:
            body["forwarded_users"] = True
        if jwt_secret is not None:
            body["jwt_secret"] = jwt_secret
        return self._request("POST", "/admin/keys", json=body)

    def revoke_key(self, key_id: int | str) -> dict:
        return self._request("DELETE", f"/admin/keys/{key_id}")

    # --- the model registry ------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        """The registry: {"budget_bytes", "used_bytes", "models": [row, ...]}."""
        return self._request("GET", "/admin/models")

    def add_model(self, name: str, source: str | None = None, hub_repo: str | None = None,
                  kind: str | None = None, pinned: bool | None = None,
                  aliases: list[str] | None = None, sleep_idle_seconds: float | None = None,
                  options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register a model from `source` (a path on the server's machine) or `hub_repo` (the
        server downloads it in the background: the row reads "downloading" until done).
        Fields left None are left out, so the server's defaults apply."""
        body: dict[str, Any] = {"name": name}
        for key, value in (("source", source), ("hub_repo", hub_repo), ("kind", kind),
                           ("pinned", pinned), ("aliases", aliases),
                           ("sleep_idle_seconds", sleep_idle_seconds), ("options", options)):
            if value is not None:
                body[key] = value
        return self._request("POST", "/admin/models", json=body)

    def remove_model(self, name: str) -> None:
        self._request("DELETE", _model_path(name))

    def set_model_pinned(self, name: str, pinned: bool) -> dict[str, Any]:
        return self._request("PATCH", _model_path(name), json={"pinned": pinned})

    def load_model(self, name: str) -> dict[str, Any]:
        """Load `name` and answer its row once it is ready (503, with the server's reason,
        when it cannot: e.g. it does not fit the memory budget)."""
        return self._request("POST", _model_path(name, "load"), timeout=LOAD_TIMEOUT_S)

    def unload_model(self, name: str) -> dict[str, Any]:
        return self._request("POST", _model_path(name, "unload"))

    # --- policies ------------------------------------------------------------------------
    def policies(self) -> dict:
        return self._request("GET", "/admin/policies")

    def put_default_policy(self, policy: dict) -> dict:
        return self._request("PUT", "/admin/policies/default", json=policy)

    def put_user_policy(self, user: str, policy: dict) -> dict:
        return self._request("PUT", f"/admin/policies/users/{user}", json=policy)

    def delete_user_policy(self, user: str) -> None:
        self._request("DELETE", f"/admin/policies/users/{user}")

    def health(self) -> bool:
        """True when the server answers /health with 200 (no token needed)."""
        try:
            return self._http.get("/health").status_code == 200
        except httpx.TransportError:
            return False
