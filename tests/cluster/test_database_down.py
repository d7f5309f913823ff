"""A replica whose PostgreSQL goes down (docs/cluster.md): a stream already running finishes,
new requests get a 503 in their API's shape saying the database is not answering (not a
500, not a 401), and once the database is back the next request is served and no usage was
lost, the stream's included. The file stops and restarts its own PostgreSQL, in order."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from officellm.app.error_handlers import DATABASE_UNAVAILABLE
from officellm.loadgen.local_postgres import PostgresServer
from officellm.loadgen.local_postgres import missing as postgres_missing
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

STREAM_TOKENS = 300


class Outage(NamedTuple):
    database: PostgresServer
    replica: ServerProcess
    key: str
    stream: threading.Thread
    stream_done: list[dict]  # the stream's final usage chunk, once it ends


def _chat(replica: ServerProcess, key: str) -> httpx.Response:
    return httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Outage]:
    """A replica on its own PostgreSQL; a person served once, then a long stream of theirs
    started, then the database shut down under it."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(f"database outage tests skipped: {reason}")
    database = PostgresServer()
    replica = None
    try:
        model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
        replica = ServerProcess(str(model), database_url=database.url())
        replica.wait_ready()
        admin = {"Authorization": f"Bearer {replica.admin_token}"}
        httpx.post(f"{replica.base_url}/admin/users", json={"name": "dora"}, headers=admin,
                   timeout=TIMEOUT).raise_for_status()
        key = httpx.post(f"{replica.base_url}/admin/keys", json={"user": "dora"},
                         headers=admin, timeout=TIMEOUT).json()["key"]
        assert _chat(replica, key).status_code == 200
        started, done = threading.Event(), []

        def long_stream() -> None:
            with httpx.stream("POST", f"{replica.base_url}/v1/chat/completions",
                              timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"},
                              json={"messages": [{"role": "user", "content": "Hi"}],
                                    "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                                    "stream": True,
                                    "stream_options": {"include_usage": True}}) as r:
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        started.set()
            done.append({"status": r.status_code, "last": lines[-2:]})

        stream = threading.Thread(target=long_stream)
        stream.start()
        assert started.wait(TIMEOUT)
        database.shutdown()
        yield Outage(database, replica, key, stream, done)
    finally:
        if replica is not None:
            replica.stop()
        database.stop()


def test_a_stream_running_when_the_database_goes_down_finishes(outage) -> None:
    outage.stream.join(TIMEOUT)
    (done,) = outage.stream_done
    assert done["status"] == 200
    assert done["last"][-1] == "data: [DONE]"
    assert f'"completion_tokens":{STREAM_TOKENS}' in done["last"][0]


def test_a_request_while_the_database_is_down_gets_a_503_saying_so(outage) -> None:
    r = _chat(outage.replica, outage.key)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"] == DATABASE_UNAVAILABLE
    assert int(r.headers["retry-after"]) > 0


def test_an_anthropic_request_while_the_database_is_down_gets_anthropics_503(outage) -> None:
    r = httpx.post(f"{outage.replica.base_url}/v1/messages", timeout=TIMEOUT,
                   headers={"x-api-key": outage.key, "anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 2,
                         "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "error"
    assert r.json()["error"]["message"] == DATABASE_UNAVAILABLE


def test_once_the_database_is_back_requests_are_served_and_no_usage_was_lost(outage) -> None:
    """Last in the file: it restarts the database."""
    outage.database.start()
    assert _chat(outage.replica, outage.key).status_code == 200
    users = httpx.get(f"{outage.replica.base_url}/admin/users", timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {outage.replica.admin_token}"})
    assert users.status_code == 200, users.text
    dora = next(u for u in users.json() if u["name"] == "dora")
    # Served: the first request, the stream (counted while the database was down), the last.
    assert dora["usage_today"]["requests"] == 3
    assert dora["usage_today"]["completion_tokens"] == 2 + STREAM_TOKENS + 2
