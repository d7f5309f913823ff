"""A model's engine process killed under a real server, seen from the console's Models tab
(real widgets, offscreen): the row reads failed, with the cause as its tooltip; once a
request has started it again, ready (issue 56)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import pytest
from PySide6.QtCore import Qt

from officellm.admin_ui.models.registry_model import RegistryModel
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.tabs.models import ModelsTab
from tests.support.server_api import TIMEOUT
from tests.support.server_process import API_KEY, BASE_FLAGS, ServerProcess

COLUMNS = [c.header for c in RegistryModel.columns]
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(*BASE_FLAGS, engine_processes=True) as server:
        yield server


def default_row(server: ServerProcess) -> dict:
    r = httpx.get(f"{server.base_url}/admin/models", timeout=TIMEOUT,
                  headers={"Authorization": f"Bearer {server.admin_token}"})
    return next(m for m in r.json()["models"] if m["default"])


def state_cell(tab: ModelsTab, name: str, role: Qt.ItemDataRole = Qt.ItemDataRole.DisplayRole):
    row = tab.model.row_of(name)
    return None if row is None else tab.model.index(row, COLUMNS.index("State")).data(role)


def test_the_models_row_reads_failed_then_ready(qtbot, server: ServerProcess) -> None:
    row = default_row(server)
    name = row["name"]
    session = AdminSession()
    session.set_target(server.base_url, server.admin_token)
    tab = ModelsTab(session)
    qtbot.addWidget(tab)

    os.kill(row["engine_pid"], signal.SIGKILL)

    def reads(text: str) -> bool:
        tab.refresh()
        return state_cell(tab, name) == text

    qtbot.waitUntil(lambda: reads("failed"), timeout=WAIT_MS)
    assert "SIGKILL" in state_cell(tab, name, Qt.ItemDataRole.ToolTipRole)

    answer = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=TIMEOUT,
                        headers={"Authorization": f"Bearer {API_KEY}"},
                        json={"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 200, answer.text
    qtbot.waitUntil(lambda: reads("ready"), timeout=WAIT_MS)
