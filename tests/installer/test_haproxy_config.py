"""The router's configuration (installer/haproxy_config.py, `officellm cluster
haproxy-config`): HAProxy accepts it, it pins people and never retries an answer, and what
cannot go in it is refused with a sentence. Behind a real HAProxy: tests/cluster/test_router.py."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from officellm.cli import main
from officellm.installer.haproxy_config import ReplicaAddress, haproxy_config
from officellm.loadgen.local_haproxy import missing

SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
REPLICAS = [ReplicaAddress.parse("a=http://10.0.0.11:8000"),
            ReplicaAddress.parse("http://10.0.0.12:8000")]


@pytest.mark.parametrize("secret", [None, SECRET])
def test_haproxy_accepts_the_configuration(tmp_path: Path, secret: str | None) -> None:
    if missing():
        pytest.skip(missing())
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(REPLICAS, jwt_secret=secret))
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_people_are_pinned_and_only_failed_connections_are_retried() -> None:
    text = haproxy_config(REPLICAS, jwt_secret=SECRET)
    assert "stick on var(txn.person)" in text and "balance leastconn" in text
    # Never on an HTTP status: a 429 is the person's answer.
    assert "    retry-on conn-failure empty-response\n" in text
    assert "    option http-no-delay\n" in text  # a stream's tokens are not held back
    assert f'jwt_verify("HS256","{SECRET}")' in text
    assert "deny deny_status 403 if { path_beg /admin }" in text
    assert "server a 10.0.0.11:8000 check" in text
    assert "server 10.0.0.12:8000 10.0.0.12:8000 check" in text


@pytest.mark.parametrize(("text", "words"), [
    ("ftp://x:1", "give http://HOST:PORT"),
    ("http://no-port", "give http://HOST:PORT"),
    ("bad name=http://x:1", "replica name 'bad name'"),
])
def test_a_replica_that_is_no_http_address_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ReplicaAddress.parse(text)


def test_two_replicas_of_one_name_and_a_secret_with_a_quote_are_refused() -> None:
    with pytest.raises(ValueError, match="same name"):
        haproxy_config([REPLICAS[0], REPLICAS[0]])
    with pytest.raises(ValueError, match="quotes"):
        haproxy_config(REPLICAS, jwt_secret='x" backdoor "' + "y" * 32)


def test_the_cli_writes_a_configuration_with_a_secret_readable_by_its_owner_only(
        tmp_path: Path, capsys) -> None:
    secret_file, out = tmp_path / "owui.secret", tmp_path / "haproxy.cfg"
    secret_file.write_text(SECRET + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "haproxy-config", "--replica", "a=http://10.0.0.11:8000",
              "--jwt-secret-file", str(secret_file), "--output", str(out)])
    assert exc.value.code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert SECRET in out.read_text()
