"""The Models tab and the dashboard's per-model gauges, driven through the real AdminClient
against a small in-memory server speaking the registry's admin API over HTTP
(tests/admin_ui/fake_models_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import Qt, QThreadPool
from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox

from officellm.admin_ui.admin_client import AdminClient
from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.models.registry_model import NOT_FITTING, RegistryModel
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.tabs.dashboard import DashboardTab
from officellm.admin_ui.tabs.models import ModelsTab
from officellm.admin_ui.widgets.add_model_dialog import AddModelDialog, NewModel
from tests.admin_ui.fake_models_server import TOKEN, FakeModelsServer, GiB, model_row
from tests.admin_ui.samples import stats_json

COLUMNS = [c.header for c in RegistryModel.columns]
WAIT_MS = 5000

# One model in each state the contract names; 2.1 GiB of the 8 GiB budget in memory.
ROWS = [
    model_row("small", memory_bytes=int(0.6 * GiB)),
    model_row("warming", state="loading", memory_bytes=int(0.5 * GiB)),
    model_row("chat", state="ready", memory_bytes=int(1.6 * GiB), pinned=True, default=True,
              kv_cache_usage=0.25, requests_running=2, last_used="2026-11-30T10:00:00+00:00"),
    model_row("dozing", state="sleeping", memory_bytes=0, kv_cache_usage=None),
    model_row("broken", state="failed", error="config.json is missing"),
    model_row("fetching", state="downloading", hub_repo="Qwen/Qwen3-8B", source="",
              memory_bytes=None, weight_bytes=None, kv_cache_bytes=None,
              download={"bytes_done": 42, "bytes_total": 100}),
    model_row("huge", memory_bytes=12 * GiB),
]


@pytest.fixture
def server() -> Iterator[FakeModelsServer]:
    fake = FakeModelsServer(ROWS).start()
    yield fake
    fake.listings_flow.set()  # a test that failed with listings held lets them go
    QThreadPool.globalInstance().waitForDone(WAIT_MS)  # no request left in flight
    fake.stop()


@pytest.fixture
def tab(qtbot, server: FakeModelsServer) -> ModelsTab:
    session = AdminSession()
    session.set_target(server.url, TOKEN)
    tab = ModelsTab(session)
    qtbot.addWidget(tab)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.model.rowCount() == len(ROWS), timeout=WAIT_MS)
    return tab


def cell(tab: ModelsTab, name: str, column: str) -> str:
    row = tab.model.row_of(name)
    assert row is not None, f"no row for {name}"
    return tab.model.index(row, COLUMNS.index(column)).data()


def wait_for_cell(qtbot, tab: ModelsTab, name: str, column: str, text: str) -> None:
    qtbot.waitUntil(lambda: tab.model.row_of(name) is not None
                    and cell(tab, name, column) == text, timeout=WAIT_MS)


# --- the table ---------------------------------------------------------------------------------
def test_the_table_lists_each_model_in_its_state(tab: ModelsTab) -> None:
    states = {m.name: cell(tab, m.name, "State") for m in tab.model.records()}
    assert states == {"small": "unloaded", "warming": "loading", "chat": "ready",
                      "dozing": "sleeping", "broken": "failed", "fetching": "downloading 42 %",
                      "huge": "unloaded"}


def test_each_column_reads_the_rows_fields(tab: ModelsTab) -> None:
    assert cell(tab, "chat", "Name") == "chat (default)"
    assert cell(tab, "chat", "Kind") == "generate"
    assert cell(tab, "chat", "Size") == "1.60 GiB"
    assert cell(tab, "chat", "Memory") == "768.00 MiB weights + 256.00 MiB KV (25% of KV used, 2 running)"
    assert cell(tab, "chat", "Last used").endswith("ago")
    assert cell(tab, "small", "Last used") == "never"
    assert cell(tab, "chat", "Pinned") == "pinned"
    assert cell(tab, "small", "Pinned") == ""
    assert cell(tab, "fetching", "Size") == "—"


def test_a_model_larger_than_the_budget_reads_does_not_fit(tab: ModelsTab) -> None:
    assert cell(tab, "huge", "Fits") == NOT_FITTING == "does not fit the budget"
    assert cell(tab, "small", "Fits") == "fits"


def test_a_failed_models_error_is_its_state_tooltip(tab: ModelsTab) -> None:
    index = tab.model.index(tab.model.row_of("broken"), COLUMNS.index("State"))
    assert index.data(Qt.ItemDataRole.ToolTipRole) == "config.json is missing"


def test_the_budget_line_says_how_much_of_the_budget_is_in_use(tab: ModelsTab) -> None:
    # loading 0.5 + ready 1.6 + sleeping 0 GiB are in memory
    assert tab.budget.text() == "Memory budget: 2.1 of 8.0 GiB in use"


def test_the_selection_survives_the_pollers_refreshes(qtbot, tab: ModelsTab,
                                                       server: FakeModelsServer) -> None:
    assert tab.select_model("broken")
    asked = len(server.sent("GET", "/admin/models"))
    tab.refresh()
    qtbot.waitUntil(lambda: len(server.sent("GET", "/admin/models")) > asked, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not tab.asking, timeout=WAIT_MS)
    assert tab.selected_model() is not None and tab.selected_model().name == "broken"


# --- downloads ---------------------------------------------------------------------------------
def test_a_download_shows_as_a_progress_bar_until_it_is_done(qtbot, tab: ModelsTab,
                                                              server: FakeModelsServer) -> None:
    assert tab.download_bar.isVisibleTo(tab)
    assert tab.download_bar.value() == 420
    assert tab.download_bar.format() == "Downloading fetching: 42 %"
    server.set_download("fetching", 90, 100)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.download_bar.value() == 900, timeout=WAIT_MS)
    assert cell(tab, "fetching", "State") == "downloading 90 %"
    server.finish_download("fetching")
    tab.refresh()
    wait_for_cell(qtbot, tab, "fetching", "State", "unloaded")
    assert not tab.download_bar.isVisibleTo(tab)


# --- actions -----------------------------------------------------------------------------------
def test_load_sends_the_load_request_and_the_row_then_reads_ready(
        qtbot, tab: ModelsTab, server: FakeModelsServer) -> None:
    tab.select_model("small")
    assert tab.load_button.isEnabled() and not tab.unload_button.isEnabled()
    tab.load_button.click()
    wait_for_cell(qtbot, tab, "small", "State", "ready")
    assert server.sent("POST", "/admin/models/small/load") == [None]
    assert tab.message.text() == "small is ready."
    assert tab.unload_button.isEnabled() and not tab.load_button.isEnabled()


def test_a_listing_that_left_before_a_load_does_not_put_the_old_state_back(
        qtbot, tab: ModelsTab, server: FakeModelsServer) -> None:
    server.listings_flow.clear()
    asked = len(server.sent("GET", "/admin/models"))
    tab.refresh()  # worked out now ("small" unloaded), answered only after the load
    qtbot.waitUntil(lambda: len(server.sent("GET", "/admin/models")) > asked, timeout=WAIT_MS)
    tab.select_model("small")
    tab.load_button.click()
    wait_for_cell(qtbot, tab, "small", "State", "ready")
    server.listings_flow.set()
    qtbot.waitUntil(lambda: len(server.sent("GET", "/admin/models")) > asked + 1
                    and not tab.asking, timeout=WAIT_MS)
    assert cell(tab, "small", "State") == "ready"


def test_unload_sends_the_unload_request_and_the_row_then_reads_unloaded(
        qtbot, tab: ModelsTab, server: FakeModelsServer) -> None:
    tab.select_model("chat")
    tab.unload_button.click()
    wait_for_cell(qtbot, tab, "chat", "State", "unloaded")
    assert server.sent("POST", "/admin/models/chat/unload") == [None]
    qtbot.waitUntil(lambda: tab.budget.text() == "Memory budget: 0.5 of 8.0 GiB in use",
                    timeout=WAIT_MS)


def test_a_load_the_server_refuses_shows_its_sentence(qtbot, tab: ModelsTab) -> None:
    tab.select_model("huge")
    tab.load_button.click()
    sentence = ("huge needs 12.0 GiB but only 5.9 GiB of the 8.0 GiB memory budget is free: "
                "unload a model, or raise --memory-budget.")
    qtbot.waitUntil(lambda: sentence in tab.message.text(), timeout=WAIT_MS)
    assert "#a00" in tab.message.text()  # shown as an error, like the other tabs'
    assert cell(tab, "huge", "State") == "unloaded"


def test_pin_pins_the_model_and_the_button_then_offers_unpin(
        qtbot, tab: ModelsTab, server: FakeModelsServer) -> None:
    tab.select_model("small")
    assert tab.pin_button.text() == "Pin"
    tab.pin_button.click()
    wait_for_cell(qtbot, tab, "small", "Pinned", "pinned")
    assert server.sent("PATCH", "/admin/models/small") == [{"pinned": True}]
    assert tab.pin_button.text() == "Unpin"


def test_remove_once_confirmed_removes_the_row(qtbot, tab: ModelsTab, server: FakeModelsServer,
                                               monkeypatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question", lambda _parent, _title, text, *a, **k:
                        asked.append(text) or QMessageBox.StandardButton.Yes)
    tab.select_model("broken")
    tab.remove_button.click()
    qtbot.waitUntil(lambda: tab.model.row_of("broken") is None, timeout=WAIT_MS)
    assert asked and asked[0].startswith("Remove broken from the registry?")
    assert server.sent("DELETE", "/admin/models/broken") == [None]
    assert tab.model.rowCount() == len(ROWS) - 1


def test_remove_not_confirmed_sends_nothing(tab: ModelsTab, server: FakeModelsServer,
                                            monkeypatch) -> None:
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *a, **k: QMessageBox.StandardButton.No)
    tab.select_model("broken")
    tab.remove_button.click()
    assert server.sent("DELETE", "/admin/models/broken") == []
    assert tab.model.row_of("broken") is not None


def test_adding_from_a_hub_repo_sends_only_what_was_given_and_the_row_reads_downloading(
        qtbot, tab: ModelsTab, server: FakeModelsServer) -> None:
    tab.add_model(NewModel(name="qwen", kind="generate", hub_repo="Qwen/Qwen3-0.6B"))
    wait_for_cell(qtbot, tab, "qwen", "State", "downloading 0 B")
    assert server.sent("POST", "/admin/models") == [
        {"name": "qwen", "hub_repo": "Qwen/Qwen3-0.6B", "kind": "generate"}]
    assert "downloading Qwen/Qwen3-0.6B" in tab.message.text()
    qtbot.waitUntil(lambda: tab.download_bar.format() == "Downloading fetching, qwen: 42 B so far",
                    timeout=WAIT_MS)


def test_adding_a_name_taken_shows_the_servers_sentence(qtbot, tab: ModelsTab) -> None:
    tab.add_model(NewModel(name="chat", kind="embed", source="/models/minilm"))
    qtbot.waitUntil(lambda: "A model named 'chat' is registered already." in tab.message.text(),
                    timeout=WAIT_MS)


def test_add_opens_the_dialog_and_registers_what_it_was_given(
        qtbot, tab: ModelsTab, server: FakeModelsServer, monkeypatch) -> None:
    def fill(dialog: AddModelDialog) -> int:
        dialog.name_edit.setText("minilm")
        dialog.kind_box.setCurrentText("embed")
        dialog.path_edit.setText("/models/all-MiniLM-L6-v2")
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(AddModelDialog, "exec", fill)
    tab.add_button.click()
    wait_for_cell(qtbot, tab, "minilm", "Kind", "embed")
    assert server.sent("POST", "/admin/models") == [
        {"name": "minilm", "source": "/models/all-MiniLM-L6-v2", "kind": "embed"}]


def test_the_dialogs_aliases_idle_sleep_and_options_reach_the_admin_api(
        qtbot, tab: ModelsTab, server: FakeModelsServer, monkeypatch) -> None:
    def fill(dialog: AddModelDialog) -> int:
        dialog.name_edit.setText("coder")
        dialog.path_edit.setText("/models/coder")
        dialog.aliases_edit.setText("gpt-4*, claude-*")
        dialog.sleep_edit.setText("600")
        dialog.options_edit.setText("max_model_len=8192 dtype=bfloat16")
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(AddModelDialog, "exec", fill)
    tab.add_button.click()
    wait_for_cell(qtbot, tab, "coder", "Kind", "generate")
    assert server.sent("POST", "/admin/models") == [
        {"name": "coder", "source": "/models/coder", "kind": "generate",
         "aliases": ["gpt-4*", "claude-*"], "sleep_idle_seconds": 600.0,
         "options": {"max_model_len": 8192, "dtype": "bfloat16"}}]


@pytest.mark.parametrize("field, text, problem", [
    ("aliases_edit", "gpt 4", "An alias has no spaces"),
    ("sleep_edit", "-1", "Idle sleep must be 0 (never) or more seconds."),
    ("sleep_edit", "soon", "Idle sleep is a number of seconds"),
    ("options_edit", "dtype", "Write each option as key=value"),
    ("options_edit", "max_model_len=lots", "max_model_len must be a whole number"),
    ("options_edit", '{"dtype": ', "The options are not valid JSON"),
])
def test_the_dialog_names_a_malformed_field_and_stays_open(qtbot, field, text, problem) -> None:
    dialog = AddModelDialog()
    qtbot.addWidget(dialog)
    dialog.name_edit.setText("coder")
    dialog.path_edit.setText("/models/coder")
    getattr(dialog, field).setText(text)
    dialog.accept()
    assert dialog.problem.text().startswith(problem)
    assert dialog.result() != QDialog.DialogCode.Accepted


def test_options_may_be_a_json_object(qtbot) -> None:
    dialog = AddModelDialog()
    qtbot.addWidget(dialog)
    dialog.options_edit.setText('{"kv_cache_memory": "2GiB", "max_model_len": 4096}')
    assert dialog.request().options == {"kv_cache_memory": "2GiB", "max_model_len": 4096}


def test_a_name_with_a_hash_reaches_its_route_whole(server: FakeModelsServer) -> None:
    client = AdminClient(server.url, TOKEN)
    try:
        client.add_model("q#4", source="/models/q4.gguf")
        assert client.load_model("q#4")["state"] == "ready"
    finally:
        client.close()
    assert server.sent("POST", "/admin/models/q%234/load") == [None]


# --- the add dialog ----------------------------------------------------------------------------
def test_the_dialog_says_what_is_missing_and_stays_open(qtbot) -> None:
    dialog = AddModelDialog()
    qtbot.addWidget(dialog)
    dialog.accept()
    assert dialog.problem.text() == "Give the model a name."
    assert dialog.result() != QDialog.DialogCode.Accepted
    dialog.name_edit.setText("qwen")
    dialog.from_hub.setChecked(True)
    assert dialog.problem_text() == "Type the Hub repo id, e.g. Qwen/Qwen3-8B."
    dialog.hub_edit.setText("Qwen/Qwen3-8B")
    assert dialog.problem_text() is None


def test_a_directory_picked_in_the_dialog_is_the_source(qtbot, monkeypatch) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory",
                        lambda *a, **k: "/models/Qwen3-8B")
    dialog = AddModelDialog()
    qtbot.addWidget(dialog)
    dialog.name_edit.setText("qwen")
    dialog.from_hub.setChecked(True)
    dialog.dir_button.click()
    assert dialog.from_path.isChecked()
    assert dialog.request() == NewModel(name="qwen", kind="generate", source="/models/Qwen3-8B")


def test_typing_a_hub_repo_picks_the_hub(qtbot) -> None:
    dialog = AddModelDialog()
    qtbot.addWidget(dialog)
    dialog.name_edit.setText("qwen")
    qtbot.keyClicks(dialog.hub_edit, "Qwen/Qwen3-8B")
    assert dialog.request() == NewModel(name="qwen", kind="generate", hub_repo="Qwen/Qwen3-8B")


# --- the dashboard's per-model gauges ----------------------------------------------------------
def _dashboard_from(qtbot, server: FakeModelsServer) -> DashboardTab:
    client = AdminClient(server.url, TOKEN)
    try:
        snap = StatsSnapshot.from_json(client.stats())
    finally:
        client.close()
    dash = DashboardTab()
    qtbot.addWidget(dash)
    dash.show_snapshot(snap, StatsHistory())
    return dash


def test_the_dashboard_shows_a_gauge_per_model_with_two_models_in_memory(qtbot) -> None:
    fake = FakeModelsServer([model_row("chat", state="ready", kv_cache_usage=0.25),
                             model_row("code", state="sleeping", kv_cache_usage=None),
                             model_row("minilm", kind="embed", state="ready")]).start()
    try:
        dash = _dashboard_from(qtbot, fake)
    finally:
        fake.stop()
    assert dash.model_gauges.isVisibleTo(dash)
    assert dash.model_gauges.rows() == [("chat", "KV cache 25.0%  (25 of 100 blocks)"),
                                        ("code (sleeping)", "KV cache 0.0%  (0 of 100 blocks)")]


def test_the_dashboard_has_no_per_model_gauges_with_one_model(qtbot) -> None:
    fake = FakeModelsServer([model_row("chat", state="ready", kv_cache_usage=0.25),
                             model_row("code", state="unloaded")]).start()
    try:
        dash = _dashboard_from(qtbot, fake)
    finally:
        fake.stop()
    assert not dash.model_gauges.isVisibleTo(dash)
    assert dash.model_gauges.rows() == []


def test_stats_without_models_or_with_a_wrong_shape_read_as_no_models() -> None:
    older = stats_json()
    assert "models" not in older
    assert StatsSnapshot.from_json(older).models == []
    assert StatsSnapshot.from_json({**older, "models": None}).models == []
    assert StatsSnapshot.from_json({**older, "models": {"chat": 1}}).models == []
    odd = StatsSnapshot.from_json({**older, "models": ["chat", {"name": "code"}]}).models
    assert [(m.name, m.kv_cache_usage, m.num_blocks_total) for m in odd] == [("code", None, None)]


# --- the main window ---------------------------------------------------------------------------
def test_the_main_window_has_a_models_tab_that_the_poller_refreshes(
        qtbot, tmp_path, server: FakeModelsServer) -> None:
    from officellm.admin_ui.console_settings import REMOTE, ConsoleSettings
    from officellm.admin_ui.local_server import LocalServer
    from officellm.admin_ui.main_window import MainWindow

    token = tmp_path / "admin_token"
    token.write_text(TOKEN + "\n")
    w = MainWindow(ConsoleSettings(mode=REMOTE, remote_url=server.url, token_file=str(token)),
                   LocalServer(tmp_path / "console"), use_tray=False, show_dialogs=False)
    qtbot.addWidget(w)
    try:
        titles = [w.tabs.tabText(i) for i in range(w.tabs.count())]
        assert w.tabs.widget(titles.index("Models")) is w.models
        # The tab is never shown here: its rows come from the stats poller's refreshes.
        qtbot.waitUntil(lambda: w.models.model.rowCount() == len(ROWS), timeout=WAIT_MS)
        server.set_download("fetching", 90, 100)
        wait_for_cell(qtbot, w.models, "fetching", "State", "downloading 90 %")
    finally:
        w.close()


def test_a_model_not_planned_yet_reads_neither_fitting_nor_not() -> None:
    from officellm.admin_ui.registry import ModelRow

    row = ModelRow.from_json({**model_row("fresh"), "fits": None})
    model = RegistryModel()
    model.set_records([row])
    assert model.index(0, COLUMNS.index("Fits")).data() == "—"
