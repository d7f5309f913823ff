"""Acceptance 7 (and issue #10's crash safety): SIGKILL the server under traffic from six
clients, restart on the same database: the file passes `PRAGMA integrity_check`, users, keys
and policies are intact, and usage loses at most the last unflushed batch: every request
answered more than one flush interval (plus a flush's own time) before the kill is counted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai

from officellm.app.accounts.usage_writer import FLUSH_INTERVAL_S
from officellm.app.db import Database, list_usage
from tests.policy.helpers import TIMEOUT, Admin, Office, chat
from tests.support.server_process import ServerProcess

MODEL = "SmolLM2-135M-Instruct.Q4_1"
CLIENTS = 6
# A request's usage is buffered before its answer is sent, and the buffer is committed every
# FLUSH_INTERVAL_S; a flush itself takes milliseconds, given a generous margin here.
LOSS_WINDOW_S = FLUSH_INTERVAL_S + 0.5


def _traffic(office: Office, key: str, stop: threading.Event, done: list[float]) -> None:
    """Chat requests back to back until the server dies; `done` gets each answer's time."""
    client = openai.OpenAI(base_url=f"{office.base_url}/v1", api_key=key, timeout=TIMEOUT,
                           max_retries=0)
    while not stop.is_set():
        try:
            client.chat.completions.create(model=MODEL, messages=chat(1), max_tokens=2,
                                           temperature=0)
            done.append(time.monotonic())
        except (openai.APIConnectionError, openai.APIStatusError):
            return  # the server is gone


def test_sigkill_while_counting_then_restart(tmp_path: Path) -> None:
    db_path = tmp_path / "officellm.db"
    srv = ServerProcess(api_key=None, db=db_path)
    try:
        srv.wait_ready()
        office = Office(srv, Admin(srv.base_url, db_path))
        names = ("kim", "lee", "max")
        keys = {name: office.admin.user_with_key(name, max_turns=5 + i, on_limit="notify")
                for i, name in enumerate(names)}
        office.admin.request("PUT", "/policies/default", json={"max_tokens_per_day": 10**6})
        stop, done = threading.Event(), []
        workers = [threading.Thread(target=_traffic, args=(office, keys[names[i % 3]], stop,
                                                           done)) for i in range(CLIENTS)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        while len(done) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Past the loss window and more flushes, with more requests still in flight.
        time.sleep(LOSS_WINDOW_S + 1.0)
        killed_at = time.monotonic()
        srv.kill()
        stop.set()
        for w in workers:
            w.join(TIMEOUT)
        assert len(done) >= 6
    finally:
        srv.stop(keep_db=True)

    db = Database(db_path)
    assert db.integrity_check() == "ok"
    db.close()

    again = ServerProcess(api_key=None, db=db_path)
    try:
        again.wait_ready()
        office = Office(again, Admin(again.base_url, db_path))
        assert "Admin token created" not in again.output()  # the same token still works
        users = {u["name"]: u for u in office.admin.get("/users")}
        assert {"kim", "lee", "max"} <= set(users)
        served = sum(users[n]["usage_today"]["requests"] for n in keys)
        surely_committed = sum(1 for t in done if t < killed_at - LOSS_WINDOW_S)
        assert surely_committed >= 1
        # Lost: at most the last unflushed batch. Extra: at most the requests in flight.
        assert surely_committed <= served <= len(done) + CLIENTS
        policies = office.admin.get("/policies")
        assert policies["default"]["max_tokens_per_day"] == 10**6
        assert [policies["users"][n]["max_turns"] for n in keys] == [5, 6, 7]
        keys_listed = office.admin.get("/keys")
        assert len(keys_listed) == 3 and not any(k["revoked"] for k in keys_listed)
        for key in keys.values():  # every key still authenticates
            r = office.client(key).chat.completions.create(model=MODEL, messages=chat(1),
                                                           max_tokens=1, temperature=0)
            assert r.usage.completion_tokens == 1
    finally:
        again.stop()  # SIGTERM: a clean stop writes every queued count
    db = Database(db_path)
    try:
        assert db.integrity_check() == "ok"
        with db.session() as s:
            rows = [u for u in list_usage(s) if u.user_id in {users[n]["id"] for n in keys}]
        assert sum(u.requests for u in rows) == served + len(keys)
    finally:
        db.close()
