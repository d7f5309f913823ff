"""The Usage tab drives GET /admin/usage: the real tab and admin client against the real app
(uvicorn in a thread, no model loaded), whose usage the server's own writer counted.

Set OFFICELLM_DOCS_SCREENSHOTS=1 to also write docs/img/usage.png."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from PySide6.QtCore import QDate

from officellm.admin_ui.admin_client import AdminClient
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.tabs.usage import UsageTab
from officellm.app.db.usage import utc_today
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from tests.support.app_in_thread import app_in_thread

REPO = Path(__file__).resolve().parents[2]
# (user, model, days ago, prompt, completion, task): what the office did.
USAGE = [("alice", "qwen2.5-7b", 0, 1200, 300, False), ("alice", "qwen2.5-7b", 1, 800, 250, False),
         ("alice", "qwen2.5-7b", 0, 400, 20, True), ("bob", "qwen2.5-7b", 2, 600, 90, False),
         ("bob", "llama-3.2-3b", 0, 300, 60, False), ("carol", "llama-3.2-3b", 5, 2000, 500, False)]


@dataclass
class UsageServer:
    base_url: str
    token: str


def _never_loads():
    raise RuntimeError("the usage report needs no loaded model")


@pytest.fixture(scope="module")
def usage_server(tmp_path_factory) -> Iterator[UsageServer]:
    data = tmp_path_factory.mktemp("usage-server")
    app = create_app(ServerSettings(no_auth=True, database=str(data / "officellm.db")),
                     _never_loads)
    with app_in_thread(app) as url:
        token = (data / "admin_token").read_text().strip()
        admin = AdminClient(url, token)
        ids = {name: admin.create_user(name)["id"] for name in {u[0] for u in USAGE}}
        admin.close()
        writer = app.state.server.accounts.writer  # as the request path counts
        for user, model, ago, prompt, completion, task in USAGE:
            writer.add_usage(ids[user], prompt, completion, model=model, task=task,
                             day=utc_today() - timedelta(days=ago), cached_tokens=prompt // 2,
                             busy_seconds=completion / 20)
        yield UsageServer(url, token)


@pytest.fixture
def tab(qtbot, usage_server: UsageServer) -> UsageTab:
    session = AdminSession()
    tab = UsageTab(session)
    qtbot.addWidget(tab)
    tab.resize(1000, 640)
    tab.show()
    session.set_target(usage_server.base_url, usage_server.token)
    return tab


def _names(tab: UsageTab) -> list[str]:
    return [r.name for r in tab.model.records()]


def test_by_user_shows_each_persons_totals_in_the_table_and_the_chart(qtbot, tab) -> None:
    qtbot.waitUntil(lambda: tab.report is not None and tab.report.by == "user", timeout=10_000)
    rows = {r.name: r for r in tab.model.records()}
    assert set(rows) == {"alice", "bob", "carol"}
    alice = rows["alice"]
    assert (alice.requests, alice.prompt_tokens, alice.completion_tokens) == (3, 2400, 570)
    assert (alice.task_requests, alice.task_tokens) == (1, 420)
    assert tab.chart.names == _names(tab)  # a bar per row
    assert tab.report.total.requests == len(USAGE)
    assert f"{len(USAGE)} requests" in tab.summary.text()
    if os.environ.get("OFFICELLM_DOCS_SCREENSHOTS"):
        qtbot.wait(200)
        assert tab.grab().save(str(REPO / "docs" / "img" / "usage.png"))


def test_by_model_and_a_narrower_range_ask_the_server_again(qtbot, tab) -> None:
    qtbot.waitUntil(lambda: tab.report is not None, timeout=10_000)
    tab.by.setCurrentText("model")
    qtbot.waitUntil(lambda: tab.report.by == "model", timeout=10_000)
    assert set(_names(tab)) == {"qwen2.5-7b", "llama-3.2-3b"}
    assert tab.model.headerData(0, *_horizontal_display()) == "Model"
    today = utc_today()
    tab.by.setCurrentText("day")
    tab.since.setDate(QDate(today.year, today.month, today.day).addDays(-2))
    qtbot.waitUntil(lambda: tab.report.by == "day" and len(tab.model.records()) == 3,
                    timeout=10_000)
    assert [r.requests for r in tab.model.records()] == [1, 1, 3]  # carol's day 5 is outside
    assert tab.report.since == (today - timedelta(days=2)).isoformat()


def _horizontal_display():
    from PySide6.QtCore import Qt

    return Qt.Orientation.Horizontal, Qt.ItemDataRole.DisplayRole


def test_without_a_server_the_tab_says_so(qtbot) -> None:
    tab = UsageTab(AdminSession())
    qtbot.addWidget(tab)
    tab.refresh()
    assert "Not connected" in tab.message.text() and tab.model.rowCount() == 0
