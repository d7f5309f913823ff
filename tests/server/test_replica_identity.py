"""How a replica names itself among the others (app/serving/replica_heartbeat.py)."""

from __future__ import annotations

import socket

from officellm.app.serving.replica_heartbeat import ReplicaIdentity


def test_by_default_a_replica_is_its_machine_and_port_reached_where_it_listens() -> None:
    me = ReplicaIdentity.of("10.0.0.11", 8000, None, None)
    assert me == ReplicaIdentity(f"{socket.gethostname()}:8000", "http://10.0.0.11:8000")


def test_listening_on_every_address_it_is_reached_by_its_machines_name() -> None:
    assert ReplicaIdentity.of("0.0.0.0", 8000, None, None).url == \
        f"http://{socket.gethostname()}:8000"


def test_an_ipv6_address_is_bracketed_and_given_names_win() -> None:
    assert ReplicaIdentity.of("::1", 8000, None, None).url == "http://[::1]:8000"
    assert ReplicaIdentity.of("0.0.0.0", 8000, "box-a", "https://a.example") == \
        ReplicaIdentity("box-a", "https://a.example")
