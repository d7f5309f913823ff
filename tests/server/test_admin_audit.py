"""The audit log through the admin API (docs/admin_api.md "Audit log"): every /admin route
either writes one audit row per change, with who made it and the values before and after,
or is marked read-only (app/admin/audit.py READ_ONLY_ROUTES); and no row holds a secret.

The real app under uvicorn on a free loopback port, in this process (so the console's
AdminClient and the CLI reach it as they would a server), with a default model that never
loads; one registered model (the tests' shared tiny llama) is loaded and unloaded for
real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from officellm.admin_ui.admin_client import AdminClient, console_actor
from officellm.app.admin.audit import READ_ONLY_ROUTES
from officellm.app.db.database import Database
from officellm.app.db.keys import hash_key
from officellm.app.db.tables import ApiKey
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.cli import main
from officellm.cli.actor import cli_actor
from tests.support.app_in_thread import app_in_thread
from tests.support.tiny_models import shared_tiny_model

CONSOLE = {"X-Officellm-Client": "console:tester"}
# A small KV pool in float32 (tests/server/test_model_pool.py's): it loads in a second or two.
TINY_OPTIONS = {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "float32",
                "kv_cache_memory": "32MiB"}


def _never_loads():
    raise RuntimeError("no default model in these tests")


@dataclass
class Admin:
    url: str
    client: httpx.Client
    token: str
    db_path: Path
    routes: set[str]
    tiny_model: str

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, **params: Any) -> Any:
        r = self.client.request(method, path, json=body, params=params or None,
                                headers={"Authorization": f"Bearer {self.token}",
                                         **(headers or {})})
        return r

    def audit(self, **params: Any) -> list[dict[str, Any]]:
        r = self.call("GET", "/admin/audit", **{"limit": 10_000, **params})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory, smollm2_dir) -> Iterator[Admin]:
    tiny = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    tmp = tmp_path_factory.mktemp("audit")
    db_path = tmp / "officellm.db"
    app = create_app(ServerSettings(no_auth=True, database=str(db_path),
                                    engine_in_process=True), _never_loads)
    # The app's own list of its routes, as it declares them (its OpenAPI schema).
    routes = {f"{method.upper()} {path}" for path, methods in app.openapi()["paths"].items()
              if path.startswith("/admin/") for method in methods}
    with app_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield Admin(url, client, (tmp / "admin_token").read_text().strip(), db_path, routes,
                    str(tiny))


@dataclass
class Change:
    """One audited route called once: the row it must write."""

    route: str  # "METHOD /admin/path" as the app declares it
    path: str
    body: Any
    action: str
    target: str
    before: bool  # whether the row has a before (the thing existed)
    after: bool
    changed: dict[str, Any] = field(default_factory=dict)  # fields the after must show

    @property
    def method(self) -> str:
        return self.route.split()[0]


# Every audited route, in an order where each call finds what the earlier ones made.
CHANGES = [
    Change("POST /admin/users", "/admin/users", {"name": "alice"}, "user.create", "alice",
           False, True, {"name": "alice", "disabled": False}),
    Change("PATCH /admin/users/{name}", "/admin/users/alice", {"disabled": True},
           "user.disable", "alice", True, True, {"disabled": True}),
    Change("POST /admin/keys", "/admin/keys", {"user": "alice"}, "key.issue", "1",
           False, True, {"user_name": "alice", "revoked": False}),
    Change("DELETE /admin/keys/{key_id}", "/admin/keys/1", None, "key.revoke", "1",
           True, True, {"revoked": True}),
    Change("PUT /admin/policies/default", "/admin/policies/default", {"max_turns": 50},
           "policy.set", "default", True, True, {"max_turns": 50}),
    Change("PUT /admin/policies/users/{name}", "/admin/policies/users/alice",
           {"max_turns": 5}, "policy.set", "alice", True, True, {"max_turns": 5}),
    Change("DELETE /admin/policies/users/{name}", "/admin/policies/users/alice", None,
           "policy.clear", "alice", True, False),
    Change("POST /admin/users/{name}/purge-cache", "/admin/users/alice/purge-cache", None,
           "user.purge_cache", "alice", False, True, {"pool_blocks": 0}),
    Change("POST /admin/models", "/admin/models",
           {"name": "small", "source": "TINY", "options": TINY_OPTIONS},
           "model.add", "small", False, True, {"options": TINY_OPTIONS, "pinned": False}),
    Change("PATCH /admin/models/{name}", "/admin/models/small", {"aliases": ["tiny"]},
           "model.change", "small", True, True, {"aliases": ["tiny"]}),
    Change("POST /admin/models/{name}/load", "/admin/models/small/load", None, "model.load",
           "small", True, True, {"state": "ready"}),
    Change("POST /admin/models/{name}/unload", "/admin/models/small/unload", None,
           "model.unload", "small", True, True, {"state": "unloaded"}),
    Change("DELETE /admin/models/{name}", "/admin/models/small", None, "model.remove",
           "small", True, False),
    Change("DELETE /admin/users/{name}", "/admin/users/alice", None, "user.delete", "alice",
           True, False),
]

# A call of each read-only route that it answers (what it answers does not matter here).
READS = {
    "GET /admin/stats": ("/admin/stats", None),
    "GET /admin/plan": ("/admin/plan", None),  # 503: no model loaded
    "POST /admin/plan": ("/admin/plan", {"model": "qwen2.5-7b-instruct"}),
    "GET /admin/users": ("/admin/users", None),
    "GET /admin/keys": ("/admin/keys", None),
    "GET /admin/policies": ("/admin/policies", None),
    "GET /admin/threads": ("/admin/threads", None),
    "GET /admin/usage": ("/admin/usage", None),
    "GET /admin/events": ("/admin/events", None),
    "GET /admin/replicas": ("/admin/replicas", None),
    "GET /admin/models": ("/admin/models", None),
    "GET /admin/audit": ("/admin/audit", None),
}


def test_every_admin_route_is_audited_or_marked_read_only(admin: Admin) -> None:
    audited = {c.route for c in CHANGES}
    unmarked = admin.routes - READ_ONLY_ROUTES - audited
    assert not unmarked, (
        f"{sorted(unmarked)}: record each change with app/db/audit.py (and add the route to "
        "CHANGES here), or, if it changes nothing, add it to READ_ONLY_ROUTES")
    assert not READ_ONLY_ROUTES & audited, "a route cannot be both"
    assert (READ_ONLY_ROUTES | audited) <= admin.routes, "a listed route no longer exists"
    assert set(READS) == READ_ONLY_ROUTES


def test_each_change_writes_one_row_with_its_actor_and_values(admin: Admin) -> None:
    for change in CHANGES:
        before = admin.audit()
        body = ({**change.body, "source": admin.tiny_model} if change.body
                and change.body.get("source") == "TINY" else change.body)
        r = admin.call(change.method, change.path, body, headers=CONSOLE)
        assert r.is_success, f"{change.route}: {r.status_code} {r.text}"
        rows = admin.audit()
        assert len(rows) == len(before) + 1, f"{change.route} wrote {len(rows) - len(before)}"
        row = rows[0]  # newest first
        assert (row["actor"], row["action"], row["target"]) == (
            "console:tester", change.action, change.target), change.route
        assert (row["before"] is not None, row["after"] is not None) == (
            change.before, change.after), change.route
        assert change.changed.items() <= (row["after"] or {}).items(), (change.route, row)


def test_read_only_routes_write_no_row(admin: Admin) -> None:
    before = admin.audit()
    for route, (path, body) in READS.items():
        r = admin.call(route.split()[0], path, body)
        assert r.status_code in (200, 503), f"{route}: {r.status_code} {r.text}"
    assert admin.audit() == before


def test_a_call_that_says_no_client_is_the_admin_token(admin: Admin) -> None:
    assert admin.call("POST", "/admin/users", {"name": "bob"}).status_code == 201
    made_up = {"X-Officellm-Client": "payroll:eve"}  # not a client the log knows
    assert admin.call("PATCH", "/admin/users/bob", {"disabled": True},
                      headers=made_up).status_code == 200
    rows = admin.audit(action="user.create") + admin.audit(action="user.disable")
    bob = {r["action"]: r["actor"] for r in rows if r["target"] == "bob"}
    assert bob == {"user.create": "admin-token", "user.disable": "admin-token"}


def test_a_refused_change_writes_no_row(admin: Admin) -> None:
    before = admin.audit()
    assert admin.call("PUT", "/admin/policies/default", {"max_turns": -1},
                      headers=CONSOLE).status_code == 400
    assert admin.call("POST", "/admin/users", {"name": "bad name"},
                      headers=CONSOLE).status_code == 400
    assert admin.audit() == before


def test_the_log_is_filtered_by_time_actor_and_action_newest_first(admin: Admin) -> None:
    admin.call("POST", "/admin/users", {"name": "carol"}, headers={
        "X-Officellm-Client": "cli:carol-admin"})
    admin.call("PATCH", "/admin/users/carol", {"disabled": True}, headers=CONSOLE)
    newest, previous = admin.audit(limit=2)
    assert (newest["action"], previous["action"]) == ("user.disable", "user.create")
    assert newest["time"] >= previous["time"] and newest["id"] > previous["id"]
    assert [r["id"] for r in admin.audit(since=newest["time"])] == [newest["id"]]
    assert newest["id"] not in [r["id"] for r in admin.audit(until=newest["time"])]
    by_cli = admin.audit(actor="cli")
    assert [r["actor"] for r in by_cli] == ["cli:carol-admin"]
    assert admin.audit(actor="cli:carol-admin") == by_cli and not admin.audit(actor="cl")
    assert {r["action"] for r in admin.audit(action="user.disable")} == {"user.disable"}


def test_no_row_holds_a_key_a_token_a_secret_or_a_hash(admin: Admin) -> None:
    jwt_secret = "s3cret-" * 6
    admin.call("POST", "/admin/users", {"name": "webui"}, headers=CONSOLE)
    r = admin.call("POST", "/admin/keys", {"user": "webui", "forwarded_users": True,
                                          "jwt_secret": jwt_secret}, headers=CONSOLE)
    assert r.status_code == 201, r.text
    raw, key_id = r.json()["key"], r.json()["id"]
    assert admin.call("DELETE", f"/admin/keys/{key_id}", headers=CONSOLE).is_success
    db = Database(admin.db_path)
    with db.session() as s:
        stored = s.get(ApiKey, key_id)
        assert stored is not None
        jwt_hash = stored.jwt_secret_hash
    db.close()
    secrets = {raw, hash_key(raw), jwt_secret, admin.token, hash_key(admin.token), jwt_hash}
    logged = json.dumps(admin.audit())
    assert [r["action"] for r in admin.audit(limit=2)] == ["key.revoke", "key.issue"]
    assert not [s for s in secrets if s and s in logged]


def test_the_consoles_calls_are_recorded_as_console_and_the_os_user(admin: Admin) -> None:
    console = AdminClient(admin.url, admin.token)
    try:
        console.create_user("dora")
        newest = console.audit(limit=1)[0]
    finally:
        console.close()
    assert (newest["actor"], newest["action"], newest["target"]) == (
        console_actor(), "user.create", "dora")


def test_the_clis_admin_calls_are_recorded_as_cli_and_the_os_user(admin: Admin,
                                                                   capsys) -> None:
    assert admin.call("POST", "/admin/users", {"name": "emil"}).status_code == 201
    with pytest.raises(SystemExit) as done:
        main(["users", "purge-cache", "emil", "--url", admin.url, "--db", str(admin.db_path)])
    assert done.value.code == 0, capsys.readouterr().err
    newest = admin.audit(limit=1)[0]
    assert (newest["actor"], newest["action"], newest["target"]) == (
        cli_actor(), "user.purge_cache", "emil")
