"""officellm replicas on one PostgreSQL (docs/cluster.md), each a real `officellm serve` on
a tiny random-weight model: started together on an empty database they migrate it once and
make one admin token, which every replica then accepts; users and keys made through one are
known to all; each lists the others in /admin/replicas and names itself in every answer.
The file's last test stops the third replica."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from officellm.app.db.database import Database
from officellm.app.db.install_settings import ADMIN_TOKEN_HASH, get_setting
from officellm.app.db.migrate import head_revision
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

ROUTER = "10.0.0.1"


@pytest.fixture(scope="module")
def replicas(postgres, tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
             ) -> Iterator[tuple[str, list[ServerProcess]]]:
    """Three replicas launched at once on a fresh database, each with its own data
    directory (its own machine); the last trusts only a router at 10.0.0.1 to name clients
    (the others, uvicorn's default: a router on this machine)."""
    url = postgres.url()
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    flags = [[], [], ["--forwarded-allow-ips", ROUTER]]
    started = [ServerProcess(str(model), *f, "--replica-name", f"replica-{i}",
                             database_url=url) for i, f in enumerate(flags)]
    try:
        for replica in started:
            replica.wait_ready()
        yield url, started
    finally:
        for replica in started:
            replica.stop()


def test_replicas_started_together_migrate_the_database_once_to_the_newest_schema(
        replicas) -> None:
    url, _ = replicas
    db = Database(url)
    try:
        assert db.current_revision() == head_revision()
    finally:
        db.close()


def test_one_admin_token_is_made_and_every_replica_accepts_it(replicas) -> None:
    url, started = replicas
    written = [r.admin_token for r in started if r.admin_token is not None]
    assert len(written) == 1  # one replica made it; the others found its hash
    db = Database(url)
    try:
        with db.session() as s:
            assert get_setting(s, ADMIN_TOKEN_HASH) is not None
    finally:
        db.close()
    for replica in started:
        r = httpx.get(f"{replica.base_url}/admin/users", timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {written[0]}"})
        assert r.status_code == 200, r.text


def test_a_user_and_key_made_on_one_replica_are_served_by_the_others(replicas) -> None:
    _, started = replicas
    token = next(r.admin_token for r in started if r.admin_token is not None)
    admin = {"Authorization": f"Bearer {token}"}
    first = started[0].base_url
    assert httpx.post(f"{first}/admin/users", json={"name": "alice"}, headers=admin,
                      timeout=TIMEOUT).status_code in (200, 201)
    issued = httpx.post(f"{first}/admin/keys", json={"user": "alice"}, headers=admin,
                        timeout=TIMEOUT)
    assert issued.status_code in (200, 201), issued.text
    key = issued.json()["key"]
    for replica in started:
        r = httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=TIMEOUT,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_the_admin_api_sees_the_client_a_trusted_router_names_not_the_router(replicas) -> None:
    """X-Forwarded-For from a trusted router (here: this machine, uvicorn's default) names the
    client: a remote one is refused the admin API, though the connection is from loopback.
    From an untrusted address the header is ignored."""
    _, started = replicas
    token = next(r.admin_token for r in started if r.admin_token is not None)
    headers = {"Authorization": f"Bearer {token}", "X-Forwarded-For": "203.0.113.7"}
    through_router = httpx.get(f"{started[0].base_url}/admin/users", headers=headers,
                               timeout=TIMEOUT)
    assert through_router.status_code == 403
    assert through_router.json()["error"]["code"] == "admin_local_only"
    not_a_router = httpx.get(f"{started[2].base_url}/admin/users", headers=headers,
                             timeout=TIMEOUT)
    assert not_a_router.status_code == 200


def _admin(started: list[ServerProcess]) -> dict[str, str]:
    return {"Authorization": f"Bearer {next(r.admin_token for r in started if r.admin_token)}"}


def test_every_replica_lists_all_three_live_and_itself_as_this_one(replicas) -> None:
    _, started = replicas
    for i, replica in enumerate(started):
        r = httpx.get(f"{replica.base_url}/admin/replicas", headers=_admin(started),
                      timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        listed = r.json()
        assert [x["name"] for x in listed] == ["replica-0", "replica-1", "replica-2"]
        assert [x["this"] for x in listed] == [j == i for j in range(3)]
        assert not any(x["stale"] or x["draining"] for x in listed)
        assert {x["url"] for x in listed} == {s.base_url for s in started}


def test_each_answer_names_the_replica_that_gave_it(replicas) -> None:
    _, started = replicas
    names = [httpx.get(f"{r.base_url}/health", timeout=TIMEOUT).headers["x-officellm-replica"]
             for r in started]
    assert names == ["replica-0", "replica-1", "replica-2"]


def test_the_consoles_replicas_tab_shows_three_rows_and_an_all_pool_equal_to_their_sum(
        replicas, qtbot) -> None:
    from officellm.admin_ui.session import AdminSession
    from officellm.admin_ui.tabs.replicas import ReplicasTab

    _, started = replicas
    session = AdminSession()
    session.set_target(started[0].base_url, _admin(started)["Authorization"].split()[1])
    tab = ReplicasTab(session)
    qtbot.addWidget(tab)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.model.rowCount() == 3, timeout=30_000)
    rows = tab.model.records()
    assert [(r.name, r.state, r.this) for r in rows] == [
        ("replica-0", "live", True), ("replica-1", "live", False), ("replica-2", "live", False)]
    pools = [httpx.get(f"{r.base_url}/admin/stats", headers=_admin(started), timeout=TIMEOUT)
             .json()["engine"]["num_blocks_total"] for r in started]
    assert sum(r.engine.num_blocks_total for r in rows) == sum(pools)
    assert f"/ {sum(pools):,} blocks" in tab.summary.text()
    assert tab.summary.text().startswith("All: 3 live replica(s) of 3")


def test_a_stopped_replica_is_listed_draining_by_the_others(replicas) -> None:
    """Last in the file: it stops replica-2 (SIGTERM, a clean stop)."""
    _, started = replicas
    started[2].stop()
    listed = httpx.get(f"{started[0].base_url}/admin/replicas", headers=_admin(started),
                       timeout=TIMEOUT).json()
    assert [(x["name"], x["draining"]) for x in listed] == [
        ("replica-0", False), ("replica-1", False), ("replica-2", True)]
