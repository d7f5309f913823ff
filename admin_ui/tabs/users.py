"""Users & keys: add, disable and delete users, forget what is cached from a user's prompts,
issue a key (shown once), revoke keys, and see each user's usage today. A front-end key (Open
WebUI, ...) speaks for other people, who then appear here as users of their own,
"alice@example.com via open-webui" (docs/design.md §5)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSortFilterProxyModel, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.models.keys_model import KeyRow, KeysModel
from officellm.admin_ui.models.record_table import SORT_ROLE
from officellm.admin_ui.models.users_model import UserRow, UsersModel
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.widgets.key_dialog import KeyDialog

REFRESH_MS = 5000


def _table(model) -> tuple[QTableView, QSortFilterProxyModel]:
    proxy = QSortFilterProxyModel()
    proxy.setSourceModel(model)
    proxy.setSortRole(SORT_ROLE)
    view = QTableView()
    view.setModel(proxy)
    view.setSortingEnabled(True)
    view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QTableView.SelectionMode.SingleSelection)
    view.verticalHeader().setVisible(False)
    view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
    return view, proxy


class UsersTab(QWidget):
    key_issued = Signal(str, str)  # user, raw key (tests read it; the dialog shows it)

    def __init__(self, session: AdminSession, parent=None, show_dialogs: bool = True) -> None:
        super().__init__(parent)
        self.session = session
        self.show_dialogs = show_dialogs  # False in tests: no modal dialog to click away
        self.last_key_dialog: KeyDialog | None = None
        layout = QVBoxLayout(self)

        users_box = QGroupBox("Users")
        ul = QVBoxLayout(users_box)
        row = QHBoxLayout()
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("new user's name, e.g. alice")
        self.name_edit.returnPressed.connect(self.add_user)
        self.add_button = QPushButton("Add user")
        self.add_button.clicked.connect(self.add_user)
        self.toggle_button = QPushButton("Disable / enable")
        self.toggle_button.clicked.connect(self.toggle_selected_user)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setToolTip(
            "Delete the user with their keys, policy, threads and usage, and forget everything "
            "cached from their prompts (every model's KV cache, in memory and on disk).")
        self.delete_button.clicked.connect(self.delete_selected_user)
        self.purge_button = QPushButton("Forget cached context")
        self.purge_button.setToolTip(
            "Drop what every model has cached from this user's prompts, in memory and on "
            "disk; their next request computes its prompt anew.")
        self.purge_button.clicked.connect(self.purge_selected_user)
        self.issue_button = QPushButton("Issue key…")
        self.issue_button.clicked.connect(self.issue_key_for_selected)
        self.front_end_button = QPushButton("Issue front-end key…")
        self.front_end_button.setToolTip(
            "A key for Open WebUI or another front end: each person it sends requests for "
            "becomes a user of their own. You may pick the file holding the JWT secret the "
            "front end signs its requests with (Open WebUI's "
            "FORWARD_USER_INFO_HEADER_JWT_SECRET); cancel to trust its plain headers.")
        self.front_end_button.clicked.connect(self.issue_front_end_key_for_selected)
        for w in (self.name_edit, self.add_button, self.toggle_button, self.delete_button,
                  self.purge_button, self.issue_button, self.front_end_button):
            row.addWidget(w)
        ul.addLayout(row)
        self.users_model = UsersModel(self)
        self.users_view, self.users_proxy = _table(self.users_model)
        ul.addWidget(self.users_view)
        layout.addWidget(users_box, stretch=3)

        keys_box = QGroupBox("API keys")
        kl = QVBoxLayout(keys_box)
        krow = QHBoxLayout()
        self.revoke_button = QPushButton("Revoke key")
        self.revoke_button.clicked.connect(self.revoke_selected_key)
        krow.addWidget(QLabel("Keys are stored hashed; only their first characters are shown."))
        krow.addStretch(1)
        krow.addWidget(self.revoke_button)
        kl.addLayout(krow)
        self.keys_model = KeysModel(self)
        self.keys_view, self.keys_proxy = _table(self.keys_model)
        kl.addWidget(self.keys_view)
        layout.addWidget(keys_box, stretch=2)

        self.message = QLabel("")
        self.message.setWordWrap(True)
        layout.addWidget(self.message)

        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        session.changed.connect(self.refresh)

    # --- reading ---------------------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.refresh()

    def refresh(self) -> None:
        self.session.call(lambda c: (c.users(), c.keys()), self._show, self._error)

    def _show(self, result) -> None:
        users, keys = result
        self.users_model.set_records([UserRow.from_json(u) for u in users])
        self.keys_model.set_records([KeyRow.from_json(k) for k in keys])

    def _error(self, exc: Exception) -> None:
        self.message.setText(f"<span style='color:#a00'>{exc}</span>")

    def _ok(self, text: str) -> None:
        self.message.setText(text)
        self.refresh()

    # --- actions ---------------------------------------------------------------------------
    def selected_user(self) -> UserRow | None:
        rows = self.users_view.selectionModel().selectedRows()
        if not rows:
            return None
        return self.users_model.record(self.users_proxy.mapToSource(rows[0]).row())

    def selected_key(self) -> KeyRow | None:
        rows = self.keys_view.selectionModel().selectedRows()
        if not rows:
            return None
        return self.keys_model.record(self.keys_proxy.mapToSource(rows[0]).row())

    def select_user(self, name: str) -> bool:
        for r in range(self.users_proxy.rowCount()):
            source = self.users_proxy.mapToSource(self.users_proxy.index(r, 0))
            if self.users_model.record(source.row()).name == name:
                self.users_view.selectRow(r)
                return True
        return False

    def add_user(self) -> None:
        name = self.name_edit.text().strip()
        if not name:
            self._error(ValueError("Type the new user's name first."))
            return
        self.session.call(lambda c: c.create_user(name),
                          lambda u: (self.name_edit.clear(), self._ok(f"Added user {u['name']}.")),
                          self._error)

    def toggle_selected_user(self) -> None:
        user = self.selected_user()
        if user is None:
            self._error(ValueError("Select a user first."))
            return
        want = not user.disabled
        self.session.call(lambda c: c.set_user_disabled(user.name, want),
                          lambda u: self._ok(f"{u['name']} is now "
                                             f"{'disabled' if u['disabled'] else 'active'}."),
                          self._error)

    def delete_selected_user(self) -> None:
        user = self.selected_user()
        if user is None:
            self._error(ValueError("Select a user first."))
            return
        if self.show_dialogs and QMessageBox.question(
                self, "Delete user", f"Delete {user.name}, with their keys, policy, threads and "
                "usage, and everything cached from their prompts? This cannot be undone."
                ) != QMessageBox.StandardButton.Yes:
            return
        self.session.call(lambda c: c.delete_user(user.name),
                          lambda done: self._ok(f"Deleted {done['user']}; "
                                                f"{_forgotten(done)}."),
                          self._error)

    def purge_selected_user(self) -> None:
        user = self.selected_user()
        if user is None:
            self._error(ValueError("Select a user first."))
            return
        self.session.call(lambda c: c.purge_user_cache(user.name),
                          lambda done: self._ok(f"{done['user']}: {_forgotten(done)}."),
                          self._error)

    def issue_key_for_selected(self) -> None:
        user = self.selected_user()
        if user is None:
            self._error(ValueError("Select the user to issue a key for."))
            return
        self.issue_key(user.name)

    def issue_key(self, name: str) -> None:
        self.session.call(lambda c: c.issue_key(name), self._key_issued, self._error)

    def issue_front_end_key_for_selected(self) -> None:
        user = self.selected_user()
        if user is None:
            self._error(ValueError("Select the front end's user (e.g. open-webui) first."))
            return
        secret_file = None
        if self.show_dialogs:
            picked, _ = QFileDialog.getOpenFileName(
                self, "JWT secret file (cancel: no JWT, trust the plain headers)")
            secret_file = Path(picked) if picked else None
        self.issue_front_end_key(user.name, secret_file)

    def issue_front_end_key(self, name: str, jwt_secret_file: Path | None = None) -> None:
        """Issue a front-end key for `name`, with the JWT secret read from `jwt_secret_file`
        (it goes to the server, which keeps it in a private file beside its database)."""
        try:
            secret = (jwt_secret_file.read_text(encoding="utf-8")
                      if jwt_secret_file is not None else None)
        except (OSError, UnicodeDecodeError) as exc:
            self._error(ValueError(f"Cannot read {jwt_secret_file}: {exc}"))
            return
        self.session.call(lambda c: c.issue_key(name, forwarded_users=True, jwt_secret=secret),
                          self._key_issued, self._error)

    def _key_issued(self, answer: dict) -> None:
        user, key = answer["user"], answer["key"]
        kind = ""
        if answer.get("forwarded_users"):
            kind = " (front-end key, signed JWTs)" if answer.get("jwt_secret") else \
                " (front-end key)"
        self._ok(f"Issued key {answer.get('prefix', '')}… for {user}{kind}.")
        self.key_issued.emit(user, key)
        self.last_key_dialog = KeyDialog(user, key, self)
        if self.show_dialogs:
            self.last_key_dialog.exec()
        else:
            self.last_key_dialog.show()

    def revoke_selected_key(self) -> None:
        key = self.selected_key()
        if key is None:
            self._error(ValueError("Select a key first."))
            return
        if self.show_dialogs and QMessageBox.question(
                self, "Revoke key", f"Revoke {key.user}'s key {key.prefix}…? Clients using it "
                "stop working at once.") != QMessageBox.StandardButton.Yes:
            return
        self.session.call(lambda c: c.revoke_key(key.id),
                          lambda k: self._ok(f"Revoked key {k.get('prefix', key.prefix)}…."),
                          self._error)



def _forgotten(done: dict) -> str:
    """What a purge of a user's cached context removed, in words."""
    where = " and the KV disk tier" if done.get("disk_tier") else ""
    return (f"cached context forgotten ({done.get('pool_blocks', 0)} blocks in the running "
            f"models' memory{where})")
