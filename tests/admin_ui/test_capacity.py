"""The Capacity tab shows the server's `GET /admin/plan` as it answers it: the real tab and
admin client against a small HTTP server that plays /admin/plan (the acceptance test checks
the same tab against a real `officellm serve`), plus the what-if, which the real app answers
(`POST /admin/plan`, served by uvicorn in a thread; tests/server/test_admin_what_if.py checks
its arithmetic)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from officellm.admin_ui.admin_client import AdminClient
from officellm.admin_ui.capacity import Plan, WhatIf
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.tabs.capacity import (
    NOT_CONNECTED,
    WHAT_IF_KV_DTYPES,
    WHAT_IF_NOT_CONNECTED,
    CapacityTab,
)
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from tests.support.app_in_thread import app_in_thread

PLAN = {"model": "Qwen2.5-7B-Instruct", "bytes_per_token": 57344, "kv_cache_dtype": "bfloat16",
        "kv_cache_tokens": 197520,
        "kv_cache_bytes": 197520 * 57344, "num_blocks": 12345, "block_size": 16,
        "max_model_len": 32768, "avg_thread_tokens": 4000, "threads_at_avg": 49.38,
        "threads_at_cap": 24.11, "threads_at_max_len": 6.03, "cap": 8192}


class PlanServer:
    """Answers GET /admin/plan with `self.status` and `self.body`; counts the requests."""

    def __init__(self) -> None:
        self.status, self.body, self.requests = 200, dict(PLAN), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests += 1
                if self.path != "/admin/plan":
                    status, body = 404, {"detail": "Not Found"}
                elif outer.status == 200:
                    status, body = 200, outer.body
                else:
                    status, body = outer.status, {"error": {"message": "the model is loading"}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def plan_server() -> Iterator[PlanServer]:
    srv = PlanServer()
    yield srv
    srv.close()


def _tab(qtbot, session: AdminSession) -> CapacityTab:
    tab = CapacityTab(session)
    qtbot.addWidget(tab)
    return tab


def test_plan_is_read_as_sent_missing_fields_are_none():
    p = Plan.from_json(PLAN)
    assert (p.threads_at_avg, p.threads_at_cap, p.threads_at_max_len) == (49.38, 24.11, 6.03)
    assert p.kv_cache_bytes == 197520 * 57344 and p.cap == 8192
    older = Plan.from_json({"model": "m", "kv_cache_tokens": 1600, "avg_thread_tokens": None,
                            "threads_at_avg": None})
    # Nothing is worked out in the console: what the server did not send stays unknown.
    assert older.kv_cache_bytes is None and older.threads_at_max_len is None
    assert older.avg_thread_tokens is None and older.num_blocks is None


def test_tab_shows_the_servers_plan_when_shown(qtbot, plan_server):
    session = AdminSession()
    tab = _tab(qtbot, session)
    assert plan_server.requests == 0  # hidden: nothing asked yet
    session.set_target(plan_server.base_url, "ocl-admin-test")
    assert plan_server.requests == 0
    tab.show()
    qtbot.waitUntil(lambda: tab.plan is not None, timeout=5000)
    v = {k: label.text() for k, label in tab.values.items()}
    assert v == {
        "model": "Qwen2.5-7B-Instruct", "bpt": "57,344 B/token (bfloat16)",
        "pool": "197,520 tokens (12,345 blocks of 16; 10.55 GiB)",
        "mml": "32,768 tokens", "avg": "4,000 tokens", "at_avg": "49.38x",
        "cap": "8,192 tokens", "at_cap": "24.11x", "at_mml": "6.03x",
    }
    assert tab.message.text() == ""

    # A later answer replaces the numbers: the first thread of the day, say.
    plan_server.body = dict(PLAN, avg_thread_tokens=None, threads_at_avg=None)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.values["avg"].text() == "no threads yet today", timeout=5000)
    assert tab.values["at_avg"].text() == "—"


def test_tab_says_why_there_is_no_plan(qtbot, plan_server):
    session = AdminSession()
    tab = _tab(qtbot, session)
    tab.show()
    assert tab.message.text() == NOT_CONNECTED
    plan_server.status = 503
    session.set_target(plan_server.base_url, None)
    qtbot.waitUntil(lambda: "the model is loading" in tab.message.text(), timeout=5000)
    assert tab.plan is None and tab.values["pool"].text() == "—"

    plan_server.status = 200
    tab.refresh()
    qtbot.waitUntil(lambda: tab.plan is not None, timeout=5000)

    # A server older than /admin/plan: said so, and no numbers of the console's own instead.
    session.set_target(plan_server.base_url + "/old", None)
    assert tab.plan is None  # the other server's numbers go at once
    qtbot.waitUntil(lambda: "no /admin/plan" in tab.message.text(), timeout=5000)
    assert all(label.text() == "—" for label in tab.values.values())


@dataclass
class AdminServer:
    """The real app under uvicorn on a free loopback port, with its admin token."""

    base_url: str
    token: str


def _never_loads():
    raise RuntimeError("the what-if needs no loaded model")


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory) -> Iterator[AdminServer]:
    data = tmp_path_factory.mktemp("what-if-server")
    app = create_app(ServerSettings(no_auth=True, database=str(data / "officellm.db")),
                     _never_loads)
    with app_in_thread(app) as url:
        yield AdminServer(url, (data / "admin_token").read_text().strip())


def test_the_what_if_kv_dtypes_are_the_servers(admin_server):
    from officellm.engine.precision.kv_cache_dtype import check_kv_cache_dtype

    client = AdminClient(admin_server.base_url, admin_server.token)
    try:
        for name in WHAT_IF_KV_DTYPES:
            check_kv_cache_dtype(name)  # raises for a name the server would refuse
            question = WhatIf("Qwen2.5-7B-Instruct", "80GiB", kv_cache_dtype=name)
            assert client.what_if_plan(question.to_json())["plan"]["kv_cache_dtype"] == name
    finally:
        client.close()


def _what_if_tab(qtbot, server: AdminServer) -> CapacityTab:
    """The tab connected to `server`, with a shipped model named in the what-if."""
    session = AdminSession()
    tab = _tab(qtbot, session)
    session.set_target(server.base_url, server.token)
    tab.wi_model.setText("Qwen2.5-7B-Instruct")
    return tab


def test_the_what_if_plans_with_the_chosen_kv_dtype(qtbot, admin_server):
    tab = _what_if_tab(qtbot, admin_server)
    tab.wi_kv_dtype.setCurrentText("fp8_e4m3")
    tab.run_what_if()
    # The request runs on a worker thread: the UI thread is back at once, the answer later.
    assert tab.wi_output.toPlainText() == "Working it out…"
    qtbot.waitUntil(lambda: "28,672" in tab.wi_output.toPlainText(), timeout=10000)
    assert tab.wi_output.toPlainText().startswith("Model: Qwen2.5-7B-Instruct")


def test_the_what_if_shows_the_servers_refusal(qtbot, admin_server):
    tab = _what_if_tab(qtbot, admin_server)
    tab.wi_memory.setText("lots")
    tab.run_what_if()
    qtbot.waitUntil(lambda: tab.wi_output.toPlainText().startswith("Cannot plan:"),
                    timeout=10000)
    assert "Cannot read a memory size from 'lots'" in tab.wi_output.toPlainText()


def test_the_what_if_needs_a_server(qtbot):
    tab = _tab(qtbot, AdminSession())
    tab.wi_model.setText("Qwen2.5-7B-Instruct")
    tab.run_what_if()
    assert tab.wi_output.toPlainText() == WHAT_IF_NOT_CONNECTED
