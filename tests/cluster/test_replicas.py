"""officellm replicas on one PostgreSQL (docs/cluster.md), each a real `officellm serve` on
a tiny random-weight model: started together on an empty database they migrate it once and
make one admin token, which every replica then accepts; users and keys made through one are
known to all; each lists the others in /admin/replicas and names itself in every answer.
The file's last test stops the third replica."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from officellm.app.db.database import Database
from officellm.app.db.install_settings import ADMIN_TOKEN_HASH, get_setting
from officellm.app.db.migrate import head_revision
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

ROUTER = "10.0.0.1"


class Cluster(NamedTuple):
    url: str  # the database's
    replicas: list[ServerProcess]
    admin_token: str  # the one token, read from the replica that made it


@pytest.fixture(scope="module")
def cluster(postgres, tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
             ) -> Iterator[Cluster]:
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
        written = [r.admin_token for r in started if r.admin_token is not None]
        yield Cluster(url, started, written[0] if len(written) == 1 else "")
    finally:
        for replica in started:
            replica.stop()


def test_replicas_started_together_migrate_the_database_once_to_the_newest_schema(
        cluster) -> None:
    db = Database(cluster.url)
    try:
        assert db.current_revision() == head_revision()
    finally:
        db.close()


def test_one_admin_token_is_made_and_every_replica_accepts_it(cluster) -> None:
    url, started, _ = cluster
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


def test_a_user_and_key_made_on_one_replica_are_served_by_the_others(cluster) -> None:
    started = cluster.replicas
    admin = _admin(cluster)
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


def test_the_admin_api_sees_the_client_a_trusted_router_names_not_the_router(cluster) -> None:
    """X-Forwarded-For from a trusted router (here: this machine, uvicorn's default) names the
    client: a remote one is refused the admin API, though the connection is from loopback.
    From an untrusted address the header is ignored."""
    started = cluster.replicas
    headers = {**_admin(cluster), "X-Forwarded-For": "203.0.113.7"}
    through_router = httpx.get(f"{started[0].base_url}/admin/users", headers=headers,
                               timeout=TIMEOUT)
    assert through_router.status_code == 403
    assert through_router.json()["error"]["code"] == "admin_local_only"
    not_a_router = httpx.get(f"{started[2].base_url}/admin/users", headers=headers,
                             timeout=TIMEOUT)
    assert not_a_router.status_code == 200


def _admin(cluster: Cluster) -> dict[str, str]:
    return {"Authorization": f"Bearer {cluster.admin_token}"}


def test_every_replica_lists_all_three_live_and_itself_as_this_one(cluster) -> None:
    started = cluster.replicas
    for i, replica in enumerate(started):
        r = httpx.get(f"{replica.base_url}/admin/replicas", headers=_admin(cluster),
                      timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        listed = r.json()
        assert [x["name"] for x in listed] == ["replica-0", "replica-1", "replica-2"]
        assert [x["this"] for x in listed] == [j == i for j in range(3)]
        assert not any(x["stale"] or x["draining"] for x in listed)
        assert {x["url"] for x in listed} == {s.base_url for s in started}


def test_each_answer_names_the_replica_that_gave_it(cluster) -> None:
    started = cluster.replicas
    names = [httpx.get(f"{r.base_url}/health", timeout=TIMEOUT).headers["x-officellm-replica"]
             for r in started]
    assert names == ["replica-0", "replica-1", "replica-2"]


def test_a_front_end_key_issued_on_one_replica_verifies_its_jwts_on_another(cluster) -> None:
    """Its secret is sealed in the database under the install key, which each replica has a
    copy of (docs/cluster.md); one person through both replicas is one user."""
    import shutil
    import time

    import jwt

    started = cluster.replicas
    admin = _admin(cluster)
    secret = "4f3e2d1c0b0a99887766554433221100ffeeddccbbaa"
    first, second = started[0], started[1]
    assert httpx.post(f"{first.base_url}/admin/users", json={"name": "open-webui"},
                      headers=admin, timeout=TIMEOUT).status_code == 201
    issued = httpx.post(f"{first.base_url}/admin/keys", headers=admin, timeout=TIMEOUT,
                        json={"user": "open-webui", "forwarded_users": True,
                              "jwt_secret": secret})
    assert issued.status_code == 201, issued.text
    install_key = first.data_dir / "install_key"
    shutil.copy2(install_key, second.data_dir / "install_key")  # what the admin does
    now = int(time.time())
    token = jwt.encode({"sub": "u-17", "email": "zoe@example.com", "name": "Zoe",
                        "role": "user", "iss": "open-webui", "iat": now, "exp": now + 300},
                       secret, algorithm="HS256")
    for replica in (first, second):
        r = httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=TIMEOUT,
                       headers={"Authorization": f"Bearer {issued.json()['key']}",
                                "X-OpenWebUI-User-Jwt": token},
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
    # Each replica flushes its own usage when asked for the users: first's, then second's.
    httpx.get(f"{first.base_url}/admin/users", headers=admin, timeout=TIMEOUT)
    users = httpx.get(f"{second.base_url}/admin/users", headers=admin, timeout=TIMEOUT).json()
    zoe = [u for u in users if u["name"] == "zoe@example.com"]
    assert len(zoe) == 1 and zoe[0]["usage_today"]["requests"] == 2


def _person(cluster: Cluster, name: str, **policy) -> tuple[str, int]:
    """A user made through the first replica, with a key (and a policy, if given)."""
    first, admin = cluster.replicas[0].base_url, _admin(cluster)
    httpx.post(f"{first}/admin/users", json={"name": name}, headers=admin,
               timeout=TIMEOUT).raise_for_status()
    if policy:
        httpx.put(f"{first}/admin/policies/users/{name}", json=policy, headers=admin,
                  timeout=TIMEOUT).raise_for_status()
    issued = httpx.post(f"{first}/admin/keys", json={"user": name}, headers=admin,
                        timeout=TIMEOUT).json()
    return issued["key"], issued["id"]


def _chat(replica: ServerProcess, key: str) -> httpx.Response:
    return httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})


def test_a_daily_quota_counts_what_a_person_used_on_every_replica(cluster) -> None:
    key, _ = _person(cluster, "quinn", max_tokens_per_day=5)
    first, second = cluster.replicas[0], cluster.replicas[1]
    assert _chat(first, key).status_code == 200  # under the quota when it starts
    # The first replica's usage is written (its batched writer flushes for the admin API).
    httpx.get(f"{first.base_url}/admin/users", headers=_admin(cluster), timeout=TIMEOUT)
    refused = _chat(second, key)  # the second replica has served quinn nothing yet
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"


def test_a_key_revoked_on_one_replica_is_refused_by_the_others(cluster) -> None:
    key, key_id = _person(cluster, "rita")
    second = cluster.replicas[1]
    assert _chat(second, key).status_code == 200
    httpx.delete(f"{cluster.replicas[0].base_url}/admin/keys/{key_id}",
                 headers=_admin(cluster), timeout=TIMEOUT).raise_for_status()
    assert _chat(second, key).status_code == 401


def test_a_policy_changed_on_one_replica_applies_on_anothers_next_request(cluster) -> None:
    key, _ = _person(cluster, "paz")
    second = cluster.replicas[1]
    assert _chat(second, key).status_code == 200
    httpx.put(f"{cluster.replicas[0].base_url}/admin/policies/users/paz",
              json={"max_context_tokens": 4, "on_limit": "reject"}, headers=_admin(cluster),
              timeout=TIMEOUT).raise_for_status()
    refused = _chat(second, key)
    assert refused.status_code == 400, refused.text
    assert "over your limit of 4" in refused.json()["error"]["message"]


def test_the_consoles_replicas_tab_shows_three_rows_and_an_all_pool_equal_to_their_sum(
        cluster, qtbot) -> None:
    from officellm.admin_ui.session import AdminSession
    from officellm.admin_ui.tabs.replicas import ReplicasTab

    started = cluster.replicas
    session = AdminSession()
    session.set_target(started[0].base_url, cluster.admin_token)
    tab = ReplicasTab(session)
    qtbot.addWidget(tab)
    tab.refresh()
    qtbot.waitUntil(lambda: tab.model.rowCount() == 3, timeout=30_000)
    rows = tab.model.records()
    assert [(r.name, r.state, r.this) for r in rows] == [
        ("replica-0", "live", True), ("replica-1", "live", False), ("replica-2", "live", False)]
    pools = [httpx.get(f"{r.base_url}/admin/stats", headers=_admin(cluster), timeout=TIMEOUT)
             .json()["engine"]["num_blocks_total"] for r in started]
    assert sum(r.engine.num_blocks_total for r in rows) == sum(pools)
    assert f"/ {sum(pools):,} blocks" in tab.summary.text()
    assert tab.summary.text().startswith("All: 3 live replica(s) of 3")


def test_the_consoles_all_view_shows_a_persons_kv_and_the_replica_they_are_on(
        cluster, qtbot) -> None:
    from officellm.admin_ui.session import AdminSession
    from officellm.admin_ui.tabs.replicas import ReplicasTab

    key, _ = _person(cluster, "vera")
    held = threading.Event()

    def long_stream() -> None:  # on replica-1, cut short once the console has seen it
        with httpx.stream("POST", f"{cluster.replicas[1].base_url}/v1/chat/completions",
                          timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"},
                          json={"messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": 4000, "stream": True}) as r:
            for _ in r.iter_lines():
                if held.is_set():
                    return

    stream = threading.Thread(target=long_stream)
    stream.start()
    session = AdminSession()
    session.set_target(cluster.replicas[0].base_url, cluster.admin_token)
    tab = ReplicasTab(session)
    qtbot.addWidget(tab)
    try:
        def vera_seen() -> bool:
            if not any(p.user == "vera" for p in tab.people.records()):
                tab.refresh()
                return False
            return True

        qtbot.waitUntil(vera_seen, timeout=30_000)
    finally:
        held.set()
        stream.join(TIMEOUT)
    vera = next(p for p in tab.people.records() if p.user == "vera")
    assert tab.picker.currentData() is None  # the All view
    assert vera.replicas == ("replica-1",)
    assert vera.kv_blocks >= 1 and vera.running == 1
    pool = sum(r.engine.num_blocks_total for r in tab.model.records() if r.engine)
    assert vera.kv_share == pytest.approx(vera.kv_blocks / pool)


@pytest.mark.slow  # CI budget: docs/testing.md
def test_a_stopped_replica_is_listed_draining_by_the_others(cluster) -> None:
    """Last in the file: it stops replica-2 (SIGTERM, a clean stop)."""
    started = cluster.replicas
    started[2].stop()
    listed = httpx.get(f"{started[0].base_url}/admin/replicas", headers=_admin(cluster),
                       timeout=TIMEOUT).json()
    assert [(x["name"], x["draining"]) for x in listed] == [
        ("replica-0", False), ("replica-1", False), ("replica-2", True)]
