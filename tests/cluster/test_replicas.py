"""officellm replicas on one PostgreSQL (docs/cluster.md), each a real `officellm serve` on
a tiny random-weight model: started together on an empty database they migrate it once and
make one admin token, which every replica then accepts; users and keys made through one are
known to all."""

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


@pytest.fixture(scope="module")
def replicas(postgres, tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
             ) -> Iterator[tuple[str, list[ServerProcess]]]:
    """Three replicas launched at once on a fresh database, each with its own data
    directory (its own machine)."""
    url = postgres.url()
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    started = [ServerProcess(str(model), database_url=url) for _ in range(3)]
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
