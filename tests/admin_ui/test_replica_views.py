"""The Replicas tab's views: all live replicas summed, or one; each person's hold on the
view's pool, with the replica they are on (admin_ui/replicas.py, tabs/replicas.py)."""

from __future__ import annotations

import pytest

from officellm.admin_ui.replicas import ALL, ReplicaRow, people, totals
from officellm.admin_ui.snapshot import EngineNumbers, UserShare


def _row(name: str, used: int, total: int, users: tuple[UserShare, ...] = (),
         stale: bool = False) -> ReplicaRow:
    engine = None if stale else EngineNumbers(num_blocks_total=total, num_blocks_used=used,
                                              num_running=sum(u.running for u in users))
    return ReplicaRow(name=name, url=f"http://{name}:8000", model="m", heartbeat_age_s=1.0,
                      stale=stale, draining=False, this=name == "a", engine=engine,
                      users=users)


ROWS = [
    _row("a", 30, 100, (UserShare("ann", kv_blocks=20, running=1),
                        UserShare("bob", kv_blocks=10, running=1, preemptions_total=2))),
    _row("b", 50, 300, (UserShare("cy", kv_blocks=50, running=2),
                        # bob moved here (his replica restarted): his two holds add up
                        UserShare("bob", kv_blocks=5, running=1))),
    _row("c", 0, 0, stale=True),
]


def test_the_all_view_sums_the_live_replicas_pools() -> None:
    t = totals(ROWS, ALL)
    assert (t.replicas, t.blocks_used, t.blocks_total, t.running) == (2, 80, 400, 5)


def test_one_replicas_view_is_its_own_pool() -> None:
    t = totals(ROWS, "b")
    assert (t.replicas, t.blocks_used, t.blocks_total) == (1, 50, 300)


def test_the_all_view_gives_each_person_their_kv_summed_over_replicas_as_a_share_of_all() -> None:
    shares = {p.user: p for p in people(ROWS, ALL)}
    assert [p.user for p in people(ROWS, ALL)] == ["cy", "ann", "bob"]  # heaviest first
    assert shares["bob"].replicas == ("a", "b")
    assert (shares["bob"].kv_blocks, shares["bob"].running) == (15, 2)
    assert shares["bob"].preemptions_total == 2
    assert shares["bob"].kv_share == pytest.approx(15 / 400)
    assert shares["ann"].replicas == ("a",)


def test_one_replicas_view_shows_only_its_people_as_shares_of_its_pool() -> None:
    shares = {p.user: p for p in people(ROWS, "a")}
    assert set(shares) == {"ann", "bob"}
    assert shares["bob"].kv_blocks == 10
    assert shares["ann"].kv_share == pytest.approx(20 / 100)


def test_the_picker_lists_all_and_each_replica_and_keeps_the_choice_across_refreshes(
        qtbot) -> None:
    from officellm.admin_ui.session import AdminSession
    from officellm.admin_ui.tabs.replicas import ReplicasTab

    tab = ReplicasTab(AdminSession())
    qtbot.addWidget(tab)
    tab.show_rows(ROWS)
    assert [tab.picker.itemText(i) for i in range(tab.picker.count())] == ["All", "a", "b", "c"]
    assert tab.summary.text().startswith("All: 2 live replica(s) of 3; KV cache 80 / 400")
    assert tab.people.rowCount() == 3
    tab.picker.setCurrentIndex(tab.picker.findData("b"))
    assert tab.summary.text().startswith("b: live; KV cache 50 / 300")
    assert sorted(p.user for p in tab.people.records()) == ["bob", "cy"]
    tab.show_rows(ROWS)  # the next refresh
    assert tab.picker.currentData() == "b"
    tab.show_rows(ROWS[:1])  # b left the list: back to All
    assert tab.picker.currentData() is ALL
    assert tab.summary.text().startswith("All: 1 live replica(s) of 1")
