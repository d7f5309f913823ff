"""The connection panel: manage the local server (Start/Stop, its log) or watch a server by
URL with an admin token. It decides which server the console talks to and says so through
`target_changed(url, token)`; the rest of the console only follows."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QButtonGroup,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.console_settings import LOCAL, REMOTE, ConsoleSettings, read_token_file
from officellm.admin_ui.local_server import LocalServer, ServerRecord
from officellm.admin_ui.workers import run_async

WATCH_MS = 1000


class ConnectionPanel(QWidget):
    target_changed = Signal(object, object)  # base URL or None, admin token or None
    # "running" | "starting" | "stopping" | "stopped" | "crashed" | "failed" (did not start), text
    server_state = Signal(str, str)

    def __init__(self, settings: ConsoleSettings, local: LocalServer, parent=None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.local = local
        self.state = "stopped"
        layout = QVBoxLayout(self)

        modes = QHBoxLayout()
        self.local_radio = QRadioButton("Manage the server on this computer")
        self.remote_radio = QRadioButton("Connect to a server by URL")
        group = QButtonGroup(self)
        group.addButton(self.local_radio)
        group.addButton(self.remote_radio)
        modes.addWidget(self.local_radio)
        modes.addWidget(self.remote_radio)
        modes.addStretch(1)
        layout.addLayout(modes)

        # --- local server -------------------------------------------------------------------
        self.local_box = QGroupBox("Local server")
        lf = QFormLayout(self.local_box)
        model_row = QHBoxLayout()
        self.model_edit = QLineEdit(settings.model)
        self.model_edit.setPlaceholderText("blank: the bundled SmolLM2-135M-Instruct")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_model)
        model_row.addWidget(self.model_edit)
        model_row.addWidget(browse)
        lf.addRow("Model", model_row)
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(settings.port)
        lf.addRow("Port", self.port_spin)
        self.flags_edit = QLineEdit(settings.extra_flags)
        self.flags_edit.setPlaceholderText("e.g. --max-model-len 8192 --kv-cache-memory 4GiB")
        lf.addRow("More serve flags", self.flags_edit)
        self.data_edit = QLineEdit(settings.data_dir)
        self.data_edit.setPlaceholderText("blank: the default data directory")
        lf.addRow("Server data dir", self.data_edit)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self.toggle_server)
        self.local_status = QLabel("")
        self.local_status.setWordWrap(True)
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.local_status, stretch=1)
        lf.addRow(buttons)
        layout.addWidget(self.local_box)

        # --- remote server ------------------------------------------------------------------
        self.remote_box = QGroupBox("Server by URL")
        rf = QFormLayout(self.remote_box)
        self.url_edit = QLineEdit(settings.remote_url)
        rf.addRow("URL", self.url_edit)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("admin token; blank: read it from the token file")
        rf.addRow("Admin token", self.token_edit)
        self.connect_button = QPushButton("Connect")
        self.connect_button.clicked.connect(self.connect_remote)
        rf.addRow(self.connect_button)
        layout.addWidget(self.remote_box)

        self.token_file_edit = QLineEdit(settings.token_file)
        self.token_file_edit.setPlaceholderText(
            f"blank: {settings.resolved_token_file()}")
        tf = QFormLayout()
        tf.addRow("Admin token file", self.token_file_edit)
        layout.addLayout(tf)

        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log_view.setMaximumBlockCount(2000)
        self.log_view.setPlaceholderText("The local server's log appears here.")
        layout.addWidget(QLabel("Server log (tail)"))
        layout.addWidget(self.log_view, stretch=1)

        self.local_radio.toggled.connect(self.apply_mode)
        (self.local_radio if settings.mode == LOCAL else self.remote_radio).setChecked(True)
        self.apply_mode()

        self.watch = QTimer(self)
        self.watch.setInterval(WATCH_MS)
        self.watch.timeout.connect(self.check_local)
        self.watch.start()

    # --- settings --------------------------------------------------------------------------
    def collect_settings(self) -> ConsoleSettings:
        s = self.settings
        s.mode = LOCAL if self.local_radio.isChecked() else REMOTE
        s.model = self.model_edit.text().strip()
        s.port = self.port_spin.value()
        s.extra_flags = self.flags_edit.text().strip()
        s.data_dir = self.data_edit.text().strip()
        s.remote_url = self.url_edit.text().strip()
        s.token_file = self.token_file_edit.text().strip()
        return s

    def _browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model", "", "GGUF (*.gguf);;config.json (*.json)")
        if path:
            self.model_edit.setText(path[:-len("/config.json")] if path.endswith("/config.json")
                                    else path)

    def apply_mode(self) -> None:
        """Follow the chosen mode: reattach to or forget the local server, or connect by URL."""
        local = self.local_radio.isChecked()
        self.local_box.setEnabled(local)
        self.remote_box.setEnabled(not local)
        self.collect_settings()
        if local:
            record = self.local.record or self.local.reattach()
            if record:
                self._set_state("running", f"Reattached to the server started earlier "
                                           f"(pid {record.pid}, {record.base_url}).")
                self._follow(record)
            else:
                self._set_state("stopped", "The local server is not running.")
                self.target_changed.emit(None, None)
        else:
            self.connect_remote()

    # --- local server ----------------------------------------------------------------------
    def _token_for(self, record: ServerRecord | None) -> str | None:
        path = self.collect_settings().resolved_token_file() if self.settings.token_file or \
            record is None else record.admin_token_path
        return read_token_file(path)

    def _follow(self, record: ServerRecord) -> None:
        self.target_changed.emit(record.base_url, self._token_for(record))

    def toggle_server(self) -> None:
        if self.state in ("running", "starting"):
            self.stop_server()
        elif self.state in ("stopped", "crashed", "failed"):
            self.start_server()

    def start_server(self) -> None:
        config = self.collect_settings().launch_config()
        try:
            record = self.local.start(config)
        except (OSError, RuntimeError, ValueError) as exc:
            self._set_state("stopped", f"Could not start the server: {exc}")
            return
        self._set_state("starting", f"Starting (pid {record.pid}); loading the model…")
        self._follow(record)

    def stop_server(self) -> None:
        self._set_state("stopping", "Stopping: in-flight requests get to finish…")
        run_async(self.local.stop, self._stopped,
                  lambda exc: self._set_state("stopped", f"Stopping failed: {exc}"))

    def _stopped(self, code: int | None) -> None:
        self._set_state("stopped", "The local server is stopped"
                        + (f" (exit code {code})." if code is not None else "."))
        self.target_changed.emit(None, None)

    def mark_ready(self) -> None:
        """The console got stats from the local server, its model loaded: it is running."""
        if self.state == "starting":
            record = self.local.record
            self._set_state("running", f"Running (pid {record.pid}, {record.base_url})."
                            if record else "Running.")

    def check_local(self) -> None:
        """Every second: follow the log, notice a crash, pick up the token once written."""
        if not self.local_radio.isChecked() or self.local.record is None:
            return
        self._show_log(self.local.log_tail())
        if self.state in ("running", "starting") and not self.local.is_running():
            code = self.local.exit_code
            reason = self.local.failure_reason()  # its last line: why, when it says
            self._show_log(self.local.log_tail())  # again: its last lines came as it ended
            if reason and self.state == "starting":
                self._set_state("failed", f"The server did not start (exit code {code}): "
                                          f"{reason}")
            elif reason:
                self._set_state("crashed", f"The server process has exited (exit code {code}): "
                                           f"{reason} Start it again when ready.")
            else:
                self._set_state("crashed", "The server process has exited"
                                + (f" (exit code {code})" if code is not None else "")
                                + ": see its log below. Start it again when ready.")
            return
        if self.state in ("running", "starting"):
            # The token file is written at the server's first start, after we begin polling.
            self._follow(self.local.record)

    def _show_log(self, text: str) -> None:
        if text != self.log_view.toPlainText():
            self.log_view.setPlainText(text)
            bar = self.log_view.verticalScrollBar()
            bar.setValue(bar.maximum())

    def _set_state(self, state: str, text: str) -> None:
        self.state = state
        self.local_status.setText(text)
        self.start_button.setText("Stop server" if state in ("running", "starting")
                                  else "Start server")
        self.start_button.setEnabled(state != "stopping")
        self.server_state.emit(state, text)

    # --- remote ----------------------------------------------------------------------------
    def connect_remote(self) -> None:
        s = self.collect_settings()
        url = s.remote_url
        if not url:
            self.target_changed.emit(None, None)
            return
        token = self.token_edit.text().strip() or read_token_file(s.resolved_token_file())
        self.target_changed.emit(url, token)
