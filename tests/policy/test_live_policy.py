"""Acceptance 3 and 4: a policy changed through the admin API, or through the CLI on the same
database while the server runs, applies to the very next request; and the server, started on
a database at revision 0001, upgraded it and kept its rows."""

from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest

from officellm.app.db import Database
from officellm.app.db.migrate import head_revision
from tests.policy.conftest import OLD_USER
from tests.policy.helpers import Office, chat
from tests.support.server_process import REPO

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def ask(client: openai.OpenAI, turns: int):
    return client.chat.completions.create(model=MODEL, messages=chat(turns), max_tokens=2,
                                          temperature=0)


def cli(*argv: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "officellm.cli", *argv], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_admin_api_change_applies_to_the_next_request(office: Office, uniq) -> None:
    user = f"live-{uniq}"
    admin = office.admin
    client = office.client(admin.user_with_key(user))
    ask(client, 3)
    stored = admin.request("PUT", f"/policies/users/{user}",
                           json={"max_turns": 2, "on_limit": "reject"})
    assert stored["max_turns"] == 2 and stored["max_context_tokens"] is None
    assert admin.get("/policies")["users"][user] == stored
    with pytest.raises(openai.BadRequestError):
        ask(client, 3)
    admin.request("PUT", f"/policies/users/{user}", json={"on_limit": "notify"})
    assert ask(client, 3).choices[0].message.content.startswith("This chat has reached 3 turns")
    admin.request("DELETE", f"/policies/users/{user}", expect=204)  # back to the default
    assert user not in admin.get("/policies")["users"]
    assert ask(client, 3).usage.completion_tokens > 0
    events = [e for e in admin.get("/events?kind=policy_changed") if e["user"] == user]
    assert len(events) == 2


def test_cli_change_applies_to_the_next_request(office: Office, uniq) -> None:
    user = f"cli-{uniq}"
    db = str(office.admin.db_path)
    client = office.client(office.admin.user_with_key(user))
    ask(client, 2)
    cli("policy", "set", "--db", db, "--user", user, "--max-turns", "1", "--on-limit", "reject")
    with pytest.raises(openai.BadRequestError) as exc:
        ask(client, 2)
    assert "over your limit of 1" in exc.value.body["message"]
    cli("policy", "set", "--db", db, "--user", user, "--max-turns", "none")
    ask(client, 2)
    # A key revoked through the CLI is refused at once too.
    key_id = office.admin.get(f"/keys?user={user}")[0]["id"]
    cli("keys", "revoke", "--db", db, str(key_id))
    with pytest.raises(openai.AuthenticationError):
        ask(client, 1)


def test_serve_upgraded_a_0001_database_and_kept_its_rows(office: Office) -> None:
    db = Database(office.admin.db_path)
    try:
        assert db.current_revision() == head_revision()
    finally:
        db.close()
    users = {u["name"]: u for u in office.admin.get("/users")}
    assert users[OLD_USER]["id"] == 7 and users[OLD_USER]["created"].startswith("2025-01-11")
    policy = office.admin.get("/policies")["users"][OLD_USER]
    assert policy["max_turns"] == 40 and policy["on_limit"] == "notify"
    # The old user is a working user: a key for them serves requests.
    key = office.admin.request("POST", "/keys", json={"user": OLD_USER}, expect=201)["key"]
    assert ask(office.client(key), 1).usage.completion_tokens > 0
