"""Tabs, models and widgets fed with answers shaped like the admin API contract."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.models.record_table import RECORD_ROLE
from officellm.admin_ui.poller import StatsPoller
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.tabs.dashboard import DashboardTab
from officellm.admin_ui.tabs.diagnosis import DiagnosisTab
from officellm.admin_ui.tabs.threads import ThreadsTab
from officellm.admin_ui.widgets.key_dialog import KeyDialog
from tests.admin_ui.samples import stats_json, thread_json, user_json
from tests.support.server_process import free_port


def _snap(**kw) -> StatsSnapshot:
    return StatsSnapshot.from_json(stats_json(**kw))


def test_threads_heaviest_first_and_sortable(qtbot):
    tab = ThreadsTab()
    qtbot.addWidget(tab)
    tab.show_snapshot(_snap(threads=[
        thread_json("alice", "a1", 300, 2, 1000), thread_json("bob", "b1", 9000, 40, 8192),
        thread_json("alice", "a2", 5000, 12, 1000 * 8), thread_json("carol", "c1", 40, 1, None)]))
    rows = [tab.proxy.index(r, 0).data(RECORD_ROLE) for r in range(tab.proxy.rowCount())]
    assert [t.length for t in rows] == [9000, 5000, 300, 40]
    assert tab.proxy.index(0, 4).data() == "9,000 / 8,192 (110%)"
    assert "4 active thread(s) from 3 user(s)" in tab.summary.text()
    # Sorting by cap use puts the thread over its cap first, the uncapped one last.
    tab.view.sortByColumn(4, Qt.SortOrder.DescendingOrder)
    assert tab.proxy.index(0, 1).data() == "b1"
    assert tab.proxy.index(3, 1).data() == "c1"
    tab.user_filter.setCurrentText("alice")
    assert tab.proxy.rowCount() == 2
    tab.grab()  # paints the progress-bar delegate


def test_dashboard_says_a_sleeping_model_is_asleep_not_loading(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    snap = StatsSnapshot.from_json({**stats_json(), "ready": False, "state": "sleeping",
                                    "engine": None})
    tab.show_snapshot(snap, StatsHistory())
    assert snap.started
    assert tab.model_label.text().endswith("— asleep (the next request wakes it)")


def test_a_failed_model_is_not_shown_as_loading():
    snap = StatsSnapshot.from_json({**stats_json(), "ready": False, "state": "dead"})
    assert not snap.started
    assert snap.state_note == " — failed (the server's log says why)"


def test_an_older_servers_stats_without_a_state_read_as_ready_or_loading():
    assert StatsSnapshot.from_json(stats_json()).state == "ready"
    assert StatsSnapshot.from_json({**stats_json(), "ready": False}).state == "loading"


def test_dashboard_shows_the_numbers(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    history = StatsHistory()
    for i, usage in enumerate([0.1, 0.5, 0.93]):
        snap = StatsSnapshot.from_json(stats_json(usage=usage, running=i + 1, waiting=i,
                                                  preemptions=i * 2, queries=100, hits=40,
                                                  itl=(0.025, 0.08)), received=float(i))
        history.add(snap)
        tab.show_snapshot(snap, history)
    assert tab.values["running"].text() == "3"
    assert tab.values["waiting"].text() == "2"
    assert tab.values["preemptions"].text() == "4"
    assert tab.values["prefix_hit"].text() == "40.0%"
    assert tab.values["itl"].text() == "25 ms / 80 ms"
    assert tab.gauge.value() == 930 and "93.0%" in tab.gauge.format()
    xs, ys = tab.chart.kv_curve.getData()
    assert list(xs) == [-2.0, -1.0, 0.0] and list(ys) == [10.0, 50.0, 93.0]


def test_dashboard_shows_the_kv_disk_tier_under_the_pool(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    stats = stats_json()
    stats["engine"] |= {"kv_tier_hits": 4224, "kv_tier_queries": 8460, "kv_disk": {
        "files": 1320, "bytes_used": 5 * 2**30, "capacity_bytes": 20 * 2**30,
        "blocks_written": 1320, "blocks_read": 264, "blocks_unreadable": 0,
        "writes_dropped": 0, "writable": True}}
    tab.show_snapshot(StatsSnapshot.from_json(stats), StatsHistory())
    assert tab.disk_gauge.isVisibleTo(tab)
    assert tab.disk_gauge.value() == 250
    assert tab.disk_gauge.format() == ("KV on disk 5.0 of 20.0 GiB  (1,320 blocks)  · "
                                       "264 blocks copied back")
    assert not tab.host_gauge.isVisibleTo(tab)


def test_dashboard_shows_the_kv_host_tier_in_ram_under_the_pool(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    stats = stats_json()
    stats["engine"] |= {"kv_host": {
        "blocks": 880, "bytes_used": 4 * 2**30, "capacity_bytes": 16 * 2**30,
        "blocks_stored": 1200, "blocks_read": 120, "blocks_evicted": 320, "pinned": True}}
    tab.show_snapshot(StatsSnapshot.from_json(stats), StatsHistory())
    assert tab.host_gauge.isVisibleTo(tab)
    assert tab.host_gauge.value() == 250
    assert tab.host_gauge.format() == ("KV in RAM 4.0 of 16.0 GiB  (880 blocks)  · "
                                       "120 blocks copied back  · pinned")


def test_dashboard_says_what_of_each_holders_the_disk_tier_keeps(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    users = [user_json("alice", 71, 0.71, 6) | {"kv_disk_bytes": 48 * 2**20},
             user_json("bob", 9, 0.09, 1)]
    tab.show_snapshot(StatsSnapshot.from_json(stats_json(usage=0.8, users=users)),
                      StatsHistory())
    assert tab.shares.rows() == [
        ("alice", 710, "6 running, 71 blocks, 0 preempted, 48.00 MiB on disk"),
        ("bob", 90, "1 running, 9 blocks, 0 preempted")]


def test_dashboard_has_no_disk_gauge_without_a_disk_tier(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    tab.show_snapshot(_snap(), StatsHistory())
    assert not tab.disk_gauge.isVisibleTo(tab)


def test_dashboard_counts_structured_and_tool_call_requests(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    idle = StatsSnapshot.from_json(stats_json())
    tab.show_snapshot(idle, StatsHistory())
    assert tab.values["structured"].text() == "none"
    busy = StatsSnapshot.from_json({**stats_json(), "structured_requests": {
        "tool_required": 2, "json_schema": 5, "regex": 2}})
    tab.show_snapshot(busy, StatsHistory())
    assert tab.values["structured"].text() == "json_schema 5 · regex 2 · tool_required 2"


def test_diagnosis_tab_lists_live_findings(qtbot):
    tab = DiagnosisTab()
    qtbot.addWidget(tab)
    history = StatsHistory()
    for i, p in enumerate([0, 0, 3]):
        history.add(StatsSnapshot.from_json(stats_json(preemptions=p, usage=0.99, uptime=i),
                                            received=float(i)))
    tab.show_history(history)
    assert tab.model.rowCount() >= 1
    assert "KV cache is full" in tab.model.index(0, 2).data()


def test_key_dialog_copies_the_key(qtbot):
    dialog = KeyDialog("alice", "ocl-sk-123")
    qtbot.addWidget(dialog)
    qtbot.mouseClick(dialog.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "ocl-sk-123"


def test_poller_reports_an_unreachable_server_without_blocking(qtbot):
    poller = StatsPoller(interval_ms=200)
    failures = []
    poller.failed.connect(lambda msg, status: failures.append((msg, status)))
    port = free_port()  # nothing listens there
    poller.set_target(f"http://127.0.0.1:{port}", "t")
    poller.start()
    try:
        qtbot.waitUntil(lambda: len(failures) >= 2, timeout=5000)
    finally:
        poller.stop()
    msg, status = failures[0]
    assert status is None and f"127.0.0.1:{port}" in msg


def test_relative_times_and_event_rows():
    from officellm.admin_ui.format import ago
    from officellm.admin_ui.models.events_model import EventRow

    assert ago("2026-11-30T10:00:00+00:00", now=1796032800 + 75) == "1 min ago"
    assert ago(100.0, now=112.0) == "12 s ago"
    assert ago(None) == ""
    row = EventRow.from_json({"time": "t", "kind": "policy_refusal", "user": "erin",
                              "detail": {"reason": "max_context_tokens", "tokens": 9120,
                                         "kv_cache_usage": 0.9712}})
    assert row.detail == "reason: max_context_tokens, tokens: 9,120, kv cache usage: 0.97"


def test_cap_colors():
    from officellm.admin_ui.widgets.cap_bar_delegate import level_color

    assert level_color(0.2) == "#4cae4c"
    assert level_color(0.85) == "#f0ad4e"
    assert level_color(1.3) == "#d9534f"


def test_dashboard_shows_who_holds_the_cache(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    snap = StatsSnapshot.from_json(stats_json(usage=0.8, users=[
        user_json("bob", 9, 0.09, 1), user_json("alice", 71, 0.71, 6, preempted=2),
        user_json("carol", 0, 0.0, 0, preempted=3)]))
    tab.show_snapshot(snap, StatsHistory())
    assert tab.shares.rows() == [("alice", 710, "6 running, 71 blocks, 2 preempted"),
                                 ("bob", 90, "1 running, 9 blocks, 0 preempted")]
    assert not tab.shares.empty.isVisibleTo(tab.shares)
    idle = StatsSnapshot.from_json(stats_json())
    tab.show_snapshot(idle, StatsHistory())
    assert tab.shares.rows() == [] and tab.shares.empty.isVisibleTo(tab.shares)


def test_dashboard_shows_the_share_of_draft_tokens_kept(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    stats = stats_json()
    stats["engine"] |= {"spec_decode_num_draft_tokens": 200,
                        "spec_decode_num_accepted_tokens": 150}
    tab.show_snapshot(StatsSnapshot.from_json(stats), StatsHistory())
    assert tab.values["drafts"].text() == "75.0% of 200"


def test_dashboard_without_speculation_shows_no_draft_share(qtbot):
    tab = DashboardTab()
    qtbot.addWidget(tab)
    tab.show_snapshot(StatsSnapshot.from_json(stats_json()), StatsHistory())
    assert tab.values["drafts"].text() == "—"
