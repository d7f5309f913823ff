"""An HAProxy configuration for officellm replicas (docs/cluster.md): `officellm cluster
haproxy-config` writes it.

What it does, and why:
- Each *person* sticks to one replica, so what a replica keeps in memory for them (their
  concurrency slots, the fair scheduler's view, their prefix cache) stays exact. The person
  is, first found first: the `sub` of Open WebUI's `X-OpenWebUI-User-Jwt` when its signature
  verifies (with the front end's secret, if given), else `X-OpenWebUI-User-Id`, else a hash
  of the key (`Authorization` or `x-api-key`). A new person goes to the replica with the
  fewest connections (`leastconn`), then stays there.
- `/health` is checked every 2 s; a replica that fails twice gets no new requests, and a
  request whose connection to it fails is sent to another at once (`redispatch 1`: every
  retry goes elsewhere, without the second's pause a retry to the same replica takes). A
  stopping replica stops listening (app/serving/graceful_server.py), so its people move on
  their next request. A request is only retried when it could not connect or got no byte
  back (a replica that died, or closed an idle connection as it stopped): an HTTP answer (a
  429 for a busy person, a 400) is the person's answer, never retried elsewhere.
- Server timeouts fit server-sent events and long CPU prefills (an hour), and each token's
  event is passed on as it comes (`http-no-delay`): without it HAProxy holds small writes
  back, and a stream of one token every 9 ms arrived in bursts of ~20 every ~160 ms
  (benchmarks/router_overhead.py found it).
- `/admin` is not routed: each replica's admin API answers on its own machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# One hour: a stream of a long answer, or a long prompt's prefill on a CPU.
STREAM_TIMEOUT = "1h"
_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


@dataclass(frozen=True)
class ReplicaAddress:
    """A replica as the router reaches it: its name and `host:port`."""

    name: str
    address: str

    @classmethod
    def parse(cls, text: str) -> ReplicaAddress:
        """`NAME=URL` or a bare URL (named after its host and port); ValueError saying what
        is wrong otherwise."""
        name, sep, url = text.partition("=")
        if not sep:
            name, url = "", text
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"replica {text!r}: give http://HOST:PORT (or NAME=http://HOST:PORT)")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        address = f"{host}:{parts.port}"
        name = name or f"{parts.hostname}:{parts.port}"
        if not _NAME.match(name):
            raise ValueError(f"replica name {name!r}: use letters, digits, '.', '_', ':' or '-'")
        return cls(name, address)


def _quoted(value: str) -> str:
    if any(c in value for c in '"\\\n\r'):
        raise ValueError("the JWT secret may not contain quotes, backslashes or line breaks "
                         "in an HAProxy configuration")
    return f'"{value}"'


def haproxy_config(replicas: list[ReplicaAddress], bind: str = "0.0.0.0:8000",
                   jwt_secret: str | None = None) -> str:
    """The configuration text; ValueError for no replicas or two of one name."""
    if not replicas:
        raise ValueError("give at least one replica")
    names = [r.name for r in replicas]
    if len(set(names)) != len(names):
        raise ValueError("two replicas have the same name")
    person = [
        # Lowest precedence first: each found one overrides the one before.
        "    http-request set-var(txn.person) req.hdr(authorization),sha1,hex "
        "if { req.hdr(authorization) -m found }",
        "    http-request set-var(txn.person) req.hdr(x-api-key),sha1,hex "
        "if { req.hdr(x-api-key) -m found }",
        "    http-request set-var(txn.person) req.hdr(x-openwebui-user-id),sha1,hex "
        "if { req.hdr(x-openwebui-user-id) -m found }",
    ]
    if jwt_secret is not None:
        person.append(
            "    http-request set-var(txn.person) "
            "req.hdr(x-openwebui-user-jwt),jwt_payload_query('$.sub'),sha1,hex "
            "if { req.hdr(x-openwebui-user-jwt),jwt_verify(\"HS256\","
            f"{_quoted(jwt_secret)}) -m int 1 }}")
    servers = [f"    server {r.name} {r.address} check inter 2s fall 2 rise 1"
               for r in replicas]
    return "\n".join([
        "# officellm replicas behind HAProxy: written by `officellm cluster haproxy-config`",
        "# (installer/haproxy_config.py says why each line is there).",
        "global",
        "    maxconn 4096",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout http-request 30s",
        f"    timeout client {STREAM_TIMEOUT}",
        f"    timeout server {STREAM_TIMEOUT}",
        "    timeout check 5s",
        "    option http-no-delay",
        "    retries 2",
        "    retry-on conn-failure empty-response",
        "    option redispatch 1",
        "",
        "frontend officellm",
        f"    bind {bind}",
        "    http-request deny deny_status 403 if { path_beg /admin }",
        *person,
        "    default_backend replicas",
        "",
        "backend replicas",
        "    balance leastconn",
        "    stick-table type string len 40 size 100k expire 12h",
        "    stick on var(txn.person)",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        *servers,
        "",
    ])
