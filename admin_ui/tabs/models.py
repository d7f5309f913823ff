"""Models: the server's model registry (`/admin/models`). One row per registered model — its
kind, planned size, state, memory, last use, whether it fits the memory budget, pinned — and
the budget in use above; Load, Unload, Pin/Unpin, Remove and Add… act on it through the
admin API on worker threads. A Hub download shows as a bar while it runs."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QSortFilterProxyModel
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.admin_client import AdminClient
from officellm.admin_ui.models.record_table import SORT_ROLE
from officellm.admin_ui.models.registry_model import RegistryModel
from officellm.admin_ui.registry import ModelRow, Registry, download_progress
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.widgets.add_model_dialog import AddModelDialog, NewModel

# States a Load makes sense from: not while it is already in memory, loading or downloading.
LOADABLE = ("unloaded", "sleeping", "failed")


def _fetch(client: AdminClient) -> Registry:
    return Registry.from_json(client.models())


class ModelsTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self._asking = False
        # Bumped by every action that changed the registry: a listing asked for before it
        # may answer after it, and must not put the old state back on screen.
        self._generation = 0
        self.registry = Registry()
        layout = QVBoxLayout(self)

        top = QHBoxLayout()
        self.budget = QLabel("Memory budget: —")
        self.budget.setStyleSheet("font-weight: bold;")
        top.addWidget(self.budget, 1)
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load the model into memory now (it may take a minute).")
        self.load_button.clicked.connect(self.load_selected)
        self.unload_button = QPushButton("Unload")
        self.unload_button.setToolTip("Free the model's memory; the next request for it "
                                      "loads it again.")
        self.unload_button.clicked.connect(self.unload_selected)
        self.pin_button = QPushButton("Pin")
        self.pin_button.setToolTip("A pinned model is loaded at start and never unloaded to "
                                   "make room for another.")
        self.pin_button.clicked.connect(self.toggle_pin_selected)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_selected)
        self.add_button = QPushButton("Add…")
        self.add_button.clicked.connect(self.open_add_dialog)
        for b in (self.load_button, self.unload_button, self.pin_button, self.remove_button,
                  self.add_button):
            top.addWidget(b)
        layout.addLayout(top)

        self.model = RegistryModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QTableView.SelectionMode.SingleSelection)
        self.view.verticalHeader().setVisible(False)
        self.view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        self.model.dataChanged.connect(self._update_buttons)
        self.model.modelReset.connect(self._update_buttons)
        layout.addWidget(self.view, 1)

        self.download_bar = QProgressBar()
        self.download_bar.setRange(0, 1000)
        self.download_bar.setVisible(False)
        layout.addWidget(self.download_bar)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        layout.addWidget(self.message)

        session.changed.connect(self._server_changed)
        self._update_buttons()

    # --- reading ---------------------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.refresh()

    @property
    def asking(self) -> bool:
        """A listing is in flight."""
        return self._asking

    def refresh(self) -> None:
        """Ask for the registry again (one request at a time: the poller calls this every
        second, and a slow server must not pile requests up)."""
        if self._asking:
            return
        generation = self._generation
        task = self.session.call(_fetch, lambda reg: self._listed(generation, reg),
                                 self._list_failed)
        self._asking = task is not None

    def _server_changed(self) -> None:
        """Another server or token: a listing still in flight is the old server's."""
        self._generation += 1
        self.refresh()

    def _listed(self, generation: int, registry: Registry) -> None:
        self._asking = False
        if generation != self._generation:  # an action answered meanwhile: ask again
            self.refresh()
            return
        self.show_registry(registry)

    def _list_failed(self, exc: Exception) -> None:
        self._asking = False
        self.budget.setText(f"<span style='color:#a00'>Could not list the models: "
                            f"{html.escape(str(exc), quote=False)}</span>")

    def show_registry(self, registry: Registry) -> None:
        """Show one answer of `GET /admin/models`: the budget line, the table, the downloads."""
        self.registry = registry
        self.budget.setText(f"Memory budget: {registry.budget_text}")
        picked = self.selected_model()
        self.model.set_records(registry.models)
        if picked is not None and self.selected_model() is None:
            self.select_model(picked.name)  # the rows changed: keep the same model picked
        downloads = registry.downloads
        self.download_bar.setVisible(bool(downloads))
        if downloads:
            fraction, text = download_progress(downloads)
            if fraction is None:  # no total yet: a busy bar
                self.download_bar.setRange(0, 0)
            else:
                self.download_bar.setRange(0, 1000)
                self.download_bar.setValue(int(fraction * 1000))
            self.download_bar.setFormat(text)
            self.download_bar.setToolTip(text)

    # --- the selection ---------------------------------------------------------------------
    def selected_model(self) -> ModelRow | None:
        rows = self.view.selectionModel().selectedRows()
        if not rows:
            return None
        return self.model.record(self.proxy.mapToSource(rows[0]).row())

    def select_model(self, name: str) -> bool:
        row = self.model.row_of(name)
        if row is None:
            return False
        self.view.selectRow(self.proxy.mapFromSource(self.model.index(row, 0)).row())
        return True

    def _update_buttons(self, *_: Any) -> None:
        m = self.selected_model()
        self.load_button.setEnabled(m is not None and m.state in LOADABLE)
        self.unload_button.setEnabled(m is not None and m.in_memory)
        self.pin_button.setEnabled(m is not None)
        self.pin_button.setText("Unpin" if m is not None and m.pinned else "Pin")
        self.remove_button.setEnabled(m is not None)

    # --- actions ---------------------------------------------------------------------------
    def _error(self, exc: Exception) -> None:
        self.message.setText(f"<span style='color:#a00'>{html.escape(str(exc), quote=False)}"
                             "</span>")

    def _act(self, fn: Callable[[AdminClient], Any], busy: str,
             done: Callable[[Any], str]) -> None:
        """Run one action on a worker thread; say what happened, then list the models again."""
        self.message.setText(busy)

        def finished(answer: Any) -> None:
            self._generation += 1
            if isinstance(answer, dict):  # the model's new row: show it before the listing
                self._replace_row(ModelRow.from_json(answer))
            self.message.setText(done(answer))
            self.refresh()

        def failed(exc: Exception) -> None:
            self._generation += 1
            self._error(exc)
            self.refresh()  # the state may still have moved (a load that failed: "failed")

        if self.session.call(fn, finished, failed) is None:
            self._error(ValueError("Not connected: start the local server or connect to one "
                                   "by URL."))

    def _replace_row(self, row: ModelRow) -> None:
        rows = list(self.model.records())
        at = self.model.row_of(row.name)
        if at is None:
            rows.append(row)
        else:
            rows[at] = row
        picked = self.selected_model()
        self.model.set_records(rows)
        if picked is not None and self.selected_model() is None:
            self.select_model(picked.name)

    def _selected_or_say(self) -> ModelRow | None:
        m = self.selected_model()
        if m is None:
            self._error(ValueError("Select a model first."))
        return m

    def load_selected(self) -> None:
        m = self._selected_or_say()
        if m is None:
            return
        name = m.name
        self._act(lambda c: c.load_model(name), f"Loading {name}… (this may take a minute)",
                  lambda row: f"{name} is {row.get('state', 'loaded')}.")

    def unload_selected(self) -> None:
        m = self._selected_or_say()
        if m is None:
            return
        name = m.name
        self._act(lambda c: c.unload_model(name), f"Unloading {name}…",
                  lambda row: f"{name} is {row.get('state', 'unloaded')}: its memory is free.")

    def toggle_pin_selected(self) -> None:
        m = self._selected_or_say()
        if m is None:
            return
        name, want = m.name, not m.pinned
        self._act(lambda c: c.set_model_pinned(name, want),
                  f"{'Pinning' if want else 'Unpinning'} {name}…",
                  lambda row: f"{name} is {'pinned' if row.get('pinned') else 'no longer pinned'}.")

    def remove_selected(self) -> None:
        m = self._selected_or_say()
        if m is None:
            return
        name = m.name
        if QMessageBox.question(
                self, "Remove model", f"Remove {name} from the registry? Requests for it fail "
                "from then on; a loaded one is unloaded first.") != QMessageBox.StandardButton.Yes:
            return
        self._act(lambda c: c.remove_model(name), f"Removing {name}…",
                  lambda _: f"Removed {name}.")

    def open_add_dialog(self) -> None:
        dialog = AddModelDialog(self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.add_model(dialog.request())

    def add_model(self, new: NewModel) -> None:
        """Register `new`; from a Hub repo, the row then reads "downloading" until done."""
        where = new.hub_repo or new.source
        self._act(lambda c: c.add_model(new.name, source=new.source, hub_repo=new.hub_repo,
                                        kind=new.kind, pinned=new.pinned or None,
                                        aliases=list(new.aliases) or None,
                                        sleep_idle_seconds=new.sleep_idle_seconds,
                                        options=new.options or None),
                  f"Adding {new.name} from {where}…",
                  lambda row: f"Added {new.name}" + (
                      f": downloading {new.hub_repo} from the Hugging Face Hub."
                      if row.get("state") == "downloading" else "."))
