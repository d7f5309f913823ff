"""Replicas behind a real HAProxy, configured by `officellm cluster haproxy-config`
(installer/haproxy_config.py): each person is always served by the same replica, people are
spread over the replicas, a busy person's 429 is their answer (never retried elsewhere),
/admin is not routed, a stopping replica finishes its open stream while its people are served
by another at once, and a killed replica's people are served by another at once. The replica
names itself in `X-Officellm-Replica`. The file's last two tests stop and kill a replica."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import jwt
import pytest

from officellm.installer.haproxy_config import ReplicaAddress, haproxy_config
from officellm.loadgen.local_haproxy import HAProxy, missing
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess, free_port
from tests.support.tiny_models import shared_tiny_model

PEOPLE = 6


# The front end's JWT secret (Open WebUI's FORWARD_USER_INFO_HEADER_JWT_SECRET).
JWT_SECRET = "5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b"


class Routed(NamedTuple):
    router: HAProxy
    replicas: list[ServerProcess]
    keys: list[str]  # one person each
    admin: dict[str, str]
    front_end_key: str  # Open WebUI's, with JWT_SECRET


@pytest.fixture(scope="module")
def routed(postgres, tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
           ) -> Iterator[Routed]:
    """Three replicas on one database behind HAProxy, and six people with a key each."""
    reason = missing()
    if reason is not None:
        pytest.skip(f"router tests skipped: {reason}")
    url = postgres.url()
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    replicas = [ServerProcess(str(model), "--replica-name", f"r{i}", database_url=url)
                for i in range(3)]
    router = None
    try:
        for r in replicas:
            r.wait_ready()
        token = next(r.admin_token for r in replicas if r.admin_token)
        admin = {"Authorization": f"Bearer {token}"}
        keys = []
        for i in range(PEOPLE):
            first = replicas[0].base_url
            httpx.post(f"{first}/admin/users", json={"name": f"p{i}"}, headers=admin,
                       timeout=TIMEOUT).raise_for_status()
            issued = httpx.post(f"{first}/admin/keys", json={"user": f"p{i}"}, headers=admin,
                                timeout=TIMEOUT)
            keys.append(issued.json()["key"])
        httpx.post(f"{first}/admin/users", json={"name": "open-webui"}, headers=admin,
                   timeout=TIMEOUT).raise_for_status()
        front_end = httpx.post(f"{first}/admin/keys", headers=admin, timeout=TIMEOUT,
                               json={"user": "open-webui", "forwarded_users": True,
                                     "jwt_secret": JWT_SECRET}).json()["key"]
        # Every replica has a copy of the install key (docs/cluster.md).
        for r in replicas[1:]:
            shutil.copy2(replicas[0].data_dir / "install_key", r.data_dir / "install_key")
        port = free_port()
        config = tmp_path_factory.mktemp("router") / "haproxy.cfg"
        config.write_text(haproxy_config(
            [ReplicaAddress.parse(f"r{i}={r.base_url}") for i, r in enumerate(replicas)],
            bind=f"127.0.0.1:{port}", jwt_secret=JWT_SECRET))
        router = HAProxy(config, port)
        yield Routed(router, replicas, keys, admin, front_end)
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.stop()


def ask(routed: Routed, person: int, max_tokens: int = 1) -> httpx.Response:
    return httpx.post(f"{routed.router.base_url}/v1/chat/completions", timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {routed.keys[person]}"},
                      json={"messages": [{"role": "user", "content": "Hi"}],
                            "max_tokens": max_tokens})


def served_by(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-officellm-replica"]


def test_each_person_is_always_served_by_the_same_replica_and_all_are_used(routed) -> None:
    seen: dict[int, set[str]] = {p: set() for p in range(PEOPLE)}
    for _ in range(4):
        for person in range(PEOPLE):
            seen[person].add(served_by(ask(routed, person)))
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert set().union(*seen.values()) == {"r0", "r1", "r2"}


def test_front_end_people_are_pinned_by_their_verified_jwt_not_by_a_header(routed) -> None:
    """Through Open WebUI's key: the verified JWT's `sub` decides, whatever unverified
    X-OpenWebUI-User-Id a request carries."""
    seen: dict[str, set[str]] = {}
    for round_ in range(4):
        for sub in ("owui-1", "owui-2", "owui-3"):
            now = int(time.time())
            token = jwt.encode({"sub": sub, "email": f"{sub}@example.com", "name": sub,
                                "role": "user", "iss": "open-webui", "iat": now,
                                "exp": now + 300}, JWT_SECRET, algorithm="HS256")
            r = httpx.post(f"{routed.router.base_url}/v1/chat/completions", timeout=TIMEOUT,
                           headers={"Authorization": f"Bearer {routed.front_end_key}",
                                    "X-OpenWebUI-User-Jwt": token,
                                    "X-OpenWebUI-User-Id": f"spoof-{round_}-{sub}"},
                           json={"messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": 1})
            seen.setdefault(sub, set()).add(served_by(r))
    assert all(len(replicas) == 1 for replicas in seen.values()), seen


def test_the_admin_api_is_not_routed(routed) -> None:
    r = httpx.get(f"{routed.router.base_url}/admin/users", headers=routed.admin,
                  timeout=TIMEOUT)
    assert r.status_code == 403


class OpenStream(threading.Thread):
    """A person's streamed chat through the router, read on a thread: its status and its
    non-empty lines and when each arrived; `started` once the first line came."""

    def __init__(self, routed: Routed, person: int, max_tokens: int):
        super().__init__()
        self.request = {"url": f"{routed.router.base_url}/v1/chat/completions",
                        "headers": {"Authorization": f"Bearer {routed.keys[person]}"},
                        "json": {"messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                                 "stream_options": {"include_usage": True}}}
        self.status: int | None = None
        self.lines: list[str] = []
        self.arrived: list[float] = []  # perf_counter seconds
        self.started = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", timeout=TIMEOUT, **self.request) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line:
                    self.arrived.append(time.perf_counter())
                    self.lines.append(line)
                    self.started.set()


def test_a_busy_persons_429_comes_from_their_replica_and_is_not_retried(routed) -> None:
    """A concurrency limit of 1: while a long stream runs, a second request is refused by
    the same replica, not sent to another one (where it would have been served)."""
    first = routed.replicas[0].base_url
    httpx.put(f"{first}/admin/policies/users/p0", json={"max_concurrent_requests": 1},
              headers=routed.admin, timeout=TIMEOUT).raise_for_status()
    home = served_by(ask(routed, 0))
    stream = OpenStream(routed, 0, max_tokens=4000)
    stream.start()
    try:
        assert stream.started.wait(TIMEOUT)
        busy = ask(routed, 0)
        assert busy.status_code == 429, busy.text
        assert busy.headers["x-officellm-replica"] == home
    finally:
        stream.join(TIMEOUT)
        httpx.delete(f"{first}/admin/policies/users/p0", headers=routed.admin,
                     timeout=TIMEOUT)


def test_a_stream_through_the_router_arrives_token_by_token_not_in_bursts(routed) -> None:
    """Each token's event is passed on as the replica sends it: held back, a stream came in
    bursts of ~20 tokens (nearly every event arriving within a millisecond of the last)."""
    stream = OpenStream(routed, 3, max_tokens=60)
    stream.start()
    stream.join(TIMEOUT)
    assert stream.status == 200
    gaps = [b - a for a, b in zip(stream.arrived, stream.arrived[1:], strict=False)]
    together = sum(g < 0.001 for g in gaps)
    assert len(gaps) >= 50 and together < len(gaps) / 2, gaps


def _replica(routed: Routed, name: str) -> ServerProcess:
    return next(r for i, r in enumerate(routed.replicas) if f"r{i}" == name)


def test_a_stopping_replica_finishes_its_stream_while_its_people_go_elsewhere_at_once(
        routed) -> None:
    """SIGTERM, a clean stop: the stream it serves runs to its end, and the same person's
    next request, sent meanwhile, is served by another replica at once, not refused."""
    home = served_by(ask(routed, 2))
    stream = OpenStream(routed, 2, max_tokens=600)
    stream.start()
    try:
        assert stream.started.wait(TIMEOUT)
        _replica(routed, home).terminate()
        time.sleep(0.2)  # the signal is handled
        assert "data: [DONE]" not in stream.lines  # still streaming when the stop began
        began = time.monotonic()
        elsewhere = ask(routed, 2)
        assert served_by(elsewhere) != home
        assert time.monotonic() - began < 5
    finally:
        stream.join(TIMEOUT)
    assert stream.status == 200
    assert stream.lines[-1] == "data: [DONE]"
    usage = json.loads(stream.lines[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 600


def test_a_killed_replicas_people_are_served_by_another_at_once(routed) -> None:
    """Last in the file: it kills a replica (SIGKILL)."""
    home = served_by(ask(routed, 1))
    victim = _replica(routed, home)
    victim.kill()
    began = time.monotonic()
    r = ask(routed, 1)
    assert served_by(r) != home
    assert time.monotonic() - began < 5
