"""Security: guessing keys is throttled per address, browsers' cross-site calls are off unless
configured, keys and prompts stay out of the database and the log.

(Covered elsewhere: no cross-user prefix-cache hits by default, read from the engine's hit
counter, in tests/policy/test_prefix_cache_isolation.py.)

One real server on every interface (--host 0.0.0.0, so /admin can be tried from this machine's
network address) with --auth-failure-limit 5 and one CORS origin. The throttling tests send
from 127.0.0.2/.3/.4, so the lock-outs never touch the other tests' 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import socket
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.probes import admin_for
from tests.support.openai_errors import openai_error
from tests.support.server_process import ServerProcess

LIMIT = 5
ORIGIN = "http://intranet.example"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_model_dir), "--max-model-len", "256", "--auth-failure-limit",
                       str(LIMIT), "--cors-origin", ORIGIN, "--host", "0.0.0.0") as srv:
        yield srv


def client_from(address: str, server: ServerProcess) -> httpx.Client:
    """An HTTP client whose requests come from `address` (any 127.x reaches the server)."""
    return httpx.Client(base_url=server.base_url, timeout=30,
                        transport=httpx.HTTPTransport(local_address=address))


def network_address() -> str | None:
    """This machine's address on its network (the one a colleague's machine would reach), or
    None without one. Connecting a UDP socket sends nothing; it only picks the route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.254", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def counter(server: ServerProcess, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_wrong_keys_from_one_address_get_429_after_the_limit(server: ServerProcess) -> None:
    failures, throttled = (counter(server, f"officellm:auth_{k}_total")
                           for k in ("failures", "throttled"))
    with client_from("127.0.0.2", server) as guesser:
        for i in range(LIMIT):
            r = guesser.get("/v1/models", headers={"Authorization": f"Bearer guess-{i}"})
            openai_error(r, 401)
        r = guesser.get("/v1/models", headers={"Authorization": "Bearer guess-again"})
        err = openai_error(r, 429)
        assert err["code"] == "too_many_auth_failures" and 0 < int(r.headers["retry-after"]) <= 60
        # Locked out whatever it sends: even the right key waits, so guessing cannot go on.
        assert guesser.get("/v1/models", headers=server.headers).status_code == 429
    assert counter(server, "officellm:auth_failures_total") == failures + LIMIT
    assert counter(server, "officellm:auth_throttled_total") == throttled + 2


def test_other_addresses_are_not_locked_out(server: ServerProcess) -> None:
    with client_from("127.0.0.2", server) as guesser:  # locked out by the test above, or now
        for i in range(LIMIT + 1):
            guesser.get("/v1/models", headers={"Authorization": f"Bearer guess-{i}"})
    with client_from("127.0.0.1", server) as colleague:
        assert colleague.get("/v1/models", headers=server.headers).status_code == 200


def test_wrong_admin_tokens_count_too(server: ServerProcess) -> None:
    with client_from("127.0.0.3", server) as guesser:
        for i in range(LIMIT):
            r = guesser.get("/admin/users", headers={"Authorization": f"Bearer admin-{i}"})
            assert r.status_code == 401
        assert guesser.get("/admin/users", headers=admin_for(server).headers).status_code == 429


def test_requests_without_a_key_are_refused_but_not_counted(server: ServerProcess) -> None:
    with client_from("127.0.0.4", server) as forgetful:
        for _ in range(LIMIT + 3):
            openai_error(forgetful.get("/v1/models"), 401)
        assert forgetful.get("/v1/models", headers=server.headers).status_code == 200


def test_the_admin_api_refuses_other_machines_by_default(server: ServerProcess) -> None:
    address = network_address()
    if address is None:
        pytest.skip("this machine has no network address besides loopback")
    token = admin_for(server).headers
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10) as lan:
        remote = lan.get(f"http://{address}:{server.port}/admin/users", headers=token)
        assert openai_error(remote, 403)["code"] == "admin_local_only"
        # The OpenAI API itself is open to the network (that is what --host 0.0.0.0 is for).
        assert lan.get(f"http://{address}:{server.port}/v1/models",
                       headers=server.headers).status_code == 200
    assert httpx.get(f"{server.base_url}/admin/users", headers=token, timeout=10).status_code == 200


def test_cors_answers_only_the_configured_origin(server: ServerProcess) -> None:
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    ok = httpx.options(f"{server.base_url}/v1/chat/completions", timeout=10,
                       headers={"Origin": ORIGIN, **preflight})
    assert ok.headers.get("access-control-allow-origin") == ORIGIN
    other = httpx.options(f"{server.base_url}/v1/chat/completions", timeout=10,
                          headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    r = httpx.get(f"{server.base_url}/v1/models", timeout=10,
                  headers={"Origin": "http://evil.example", **server.headers})
    assert "access-control-allow-origin" not in r.headers


def test_keys_are_stored_only_as_hashes(server: ServerProcess) -> None:
    admin = admin_for(server)
    name = f"hash-{uuid.uuid4().hex[:6]}"
    raw = admin.user_with_key(name)
    admin.get("/keys")  # flushes the writer: the key's row and its last use are on disk
    stored = b"".join(p.read_bytes() for p in Path(server.db_path).parent.glob("officellm.db*"))
    assert raw.encode() not in stored
    assert hashlib.sha256(raw.encode()).hexdigest().encode() in stored


def test_the_admin_token_file_is_readable_by_its_owner_only(server: ServerProcess) -> None:
    mode = stat.S_IMODE(admin_for(server).token_file.stat().st_mode)
    assert mode & 0o077 == 0, oct(mode)


def test_no_prompt_text_and_no_secret_reaches_the_log(server: ServerProcess) -> None:
    marker = f"confidential-{uuid.uuid4().hex}"
    base, headers = server.base_url, server.headers
    ok = httpx.post(f"{base}/v1/chat/completions", headers=headers, timeout=60, json={
        "messages": [{"role": "user", "content": f"The merger code is {marker}"}],
        "max_tokens": 4})
    assert ok.status_code == 200
    too_long = httpx.post(f"{base}/v1/completions", headers=headers, timeout=60,
                          json={"prompt": f"{marker} " * 400, "max_tokens": 4})
    assert too_long.status_code == 400
    log = server.output()
    assert "status=200" in log  # the access line is there, at INFO
    assert marker not in log
    assert server.api_key not in log and admin_for(server).token not in log
