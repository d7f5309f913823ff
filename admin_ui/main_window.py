"""The console's main window: status banner, the server panel and the tabs, fed by the
stats poller. All HTTP happens on worker threads; this class only routes results."""

from __future__ import annotations

import time

from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QMainWindow, QSystemTrayIcon, QTabWidget, QVBoxLayout, QWidget

from officellm.admin_ui.connection_panel import ConnectionPanel
from officellm.admin_ui.console_settings import ConsoleSettings
from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.local_server import LocalServer
from officellm.admin_ui.poller import StatsPoller
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.tabs.capacity import CapacityTab
from officellm.admin_ui.tabs.dashboard import DashboardTab
from officellm.admin_ui.tabs.diagnosis import DiagnosisTab
from officellm.admin_ui.tabs.models import ModelsTab
from officellm.admin_ui.tabs.policies import PoliciesTab
from officellm.admin_ui.tabs.replicas import ReplicasTab
from officellm.admin_ui.tabs.threads import ThreadsTab
from officellm.admin_ui.tabs.usage import UsageTab
from officellm.admin_ui.tabs.users import UsersTab
from officellm.admin_ui.tray import ConsoleTray
from officellm.admin_ui.widgets.status_banner import DOWN, IDLE, UP, StatusBanner

# The Replicas tab asks every replica for its numbers: less often than the dashboard polls.
REPLICAS_REFRESH_S = 5.0


class MainWindow(QMainWindow):
    def __init__(self, settings: ConsoleSettings | None = None, local: LocalServer | None = None,
                 use_tray: bool = True, show_dialogs: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("officellm admin")
        self.resize(1100, 760)
        self.settings = settings or ConsoleSettings.load()
        self.local = local or LocalServer()
        self.history = StatsHistory()
        self.session = AdminSession(self)
        self.last_snapshot: StatsSnapshot | None = None
        self.last_ok_wall: float | None = None
        self.server_state = "stopped"

        central = QWidget()
        layout = QVBoxLayout(central)
        self.banner = StatusBanner()
        layout.addWidget(self.banner)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs, stretch=1)
        self.setCentralWidget(central)

        self.dashboard = DashboardTab()
        self.threads = ThreadsTab()
        self.users = UsersTab(self.session, show_dialogs=show_dialogs)
        self.policies = PoliciesTab(self.session)
        self.diagnosis = DiagnosisTab(self.session)
        self.capacity = CapacityTab(self.session)
        self.replicas = ReplicasTab(self.session)
        self.models = ModelsTab(self.session)
        self.usage = UsageTab(self.session)
        self._replicas_asked = 0.0

        self.poller = StatsPoller(self.settings.poll_interval_ms)
        self.poller.snapshot.connect(self.on_snapshot)
        self.poller.failed.connect(self.on_failure)

        self.panel = ConnectionPanel(self.settings, self.local)
        self.panel.target_changed.connect(self.set_target)
        self.panel.server_state.connect(self.on_server_state)
        for widget, title in [(self.panel, "Server"), (self.dashboard, "Dashboard"),
                              (self.threads, "Threads"), (self.users, "Users && keys"),
                              (self.policies, "Policies"), (self.diagnosis, "Diagnosis"),
                              (self.capacity, "Capacity"), (self.replicas, "Replicas"),
                              (self.models, "Models"), (self.usage, "Usage")]:
            self.tabs.addTab(widget, title)

        self.tray: ConsoleTray | None = None
        if use_tray and QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = ConsoleTray(self, self.panel)
            self.tray.show()

        # The panel chose a target while being built (reattach / remote); apply it now.
        self.panel.collect_settings()
        self.panel.apply_mode()
        self.poller.start()
        if self.session.connected:
            self.tabs.setCurrentWidget(self.dashboard)

    # --- routing ---------------------------------------------------------------------------
    def set_target(self, base_url: str | None, token: str | None) -> None:
        if base_url != self.session.base_url:
            self.history.clear()
            self.last_snapshot = None
        self.session.set_target(base_url, token)
        self.poller.set_target(base_url, token)
        if base_url is None:
            self._status(IDLE, "Not connected: start the local server or connect to one by URL.")

    def on_snapshot(self, snap: StatsSnapshot) -> None:
        self.last_snapshot = snap
        self.last_ok_wall = time.time()
        self.history.add(snap)
        self.dashboard.show_snapshot(snap, self.history)
        self.threads.show_snapshot(snap)
        self.diagnosis.show_history(self.history)
        if time.monotonic() - self._replicas_asked >= REPLICAS_REFRESH_S:
            self._replicas_asked = time.monotonic()
            self.replicas.refresh()
        # Every snapshot: a download's bar and a loading model's state move by the second
        # (one listing in flight at a time; the tab drops the rest).
        self.models.refresh()
        if snap.started:  # answering while it loads is not running yet: the load may fail
            self.panel.mark_ready()
        e = snap.engine
        self._status(UP, f"Connected to {self.session.base_url} — {snap.model}: KV cache "
                         f"{e.kv_cache_usage:.0%}, {e.num_running} running, {e.num_waiting} "
                         f"waiting, {e.num_preemptions_total} preemption(s)."
                     + snap.state_note)

    def on_failure(self, message: str, status: object) -> None:
        url = self.session.base_url
        stale = ("" if self.last_ok_wall is None else
                 f" Numbers shown are from {time.strftime('%H:%M:%S', time.localtime(self.last_ok_wall))}.")
        if self.server_state == "starting" and status is None:
            self._status(IDLE, f"Starting the server at {url}: loading the model…")
        elif self.server_state == "crashed":
            self._status(DOWN, f"The local server has stopped unexpectedly: {self.panel.local_status.text()}"
                         + stale)
        elif self.server_state == "failed":
            self._status(DOWN, self.panel.local_status.text())
        elif status in (401, 403):
            self._status(DOWN, f"{url} refused the admin token ({message}). Check the token "
                               "file or paste the token on the Server tab.")
        elif status is None:
            self._status(DOWN, f"Server down or unreachable at {url}: {message}.{stale}")
        else:
            self._status(DOWN, f"{url} answered with an error ({status}): {message}.{stale}")

    def on_server_state(self, state: str, text: str) -> None:
        self.server_state = state
        if state == "crashed":
            self._status(DOWN, f"The local server has stopped unexpectedly. {text}")
        elif state == "failed":  # the text is the server's own reason
            self._status(DOWN, text)
        elif state == "stopped":
            self._status(IDLE, text)

    def _status(self, level: str, text: str) -> None:
        self.banner.show_state(level, text)
        if self.tray:
            self.tray.show_status(level, text)

    # --- closing ---------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        """Remember the settings and stop polling; the server is left running on purpose."""
        self.panel.collect_settings().save()
        self.poller.set_target(None, None)
        self.poller.stop()
        if self.tray:
            self.tray.hide()
        super().closeEvent(event)
