"""This server as one of the replicas sharing its database (docs/cluster.md): registered at
start, a heartbeat every few seconds with the model it serves, marked draining when it stops.
A database that cannot be reached costs a log line, never the server."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from officellm.app.db import Database
from officellm.app.db.replicas import HEARTBEAT_INTERVAL_S, beat, register_replica

logger = logging.getLogger("officellm.server")

_ANY_ADDRESS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ReplicaIdentity:
    """How this replica is named and reached by the others and the console."""

    name: str
    url: str

    @classmethod
    def of(cls, host: str, port: int, name: str | None, url: str | None) -> ReplicaIdentity:
        """`name` and `url` as given (--replica-name, --advertise-url), else this machine's
        name with the port, and the address it listens on (its name, when it listens on
        every address)."""
        machine = socket.gethostname()
        where = machine if host in _ANY_ADDRESS else host
        if ":" in where:  # an IPv6 address
            where = f"[{where}]"
        return cls(name or f"{machine}:{port}", url or f"http://{where}:{port}")


async def run_heartbeat(db: Database, me: ReplicaIdentity, model: Callable[[], str | None],
                        interval: float = HEARTBEAT_INTERVAL_S) -> None:
    """Register `me`, then beat every `interval` seconds until cancelled; cancelled (the
    server stops), one last beat says it is draining."""

    def register() -> None:
        with db.transaction() as session:
            register_replica(session, me.name, me.url)

    def send(draining: bool = False) -> None:
        served = model()
        with db.transaction() as session:
            # The name as the table holds it (a display name: 256 characters are plenty).
            registered = beat(session, me.name, served[:256] if served else served,
                              draining=draining)
        if not registered:
            register()

    failing = False

    async def attempt(write: Callable[[], None]) -> None:
        nonlocal failing
        try:
            await asyncio.to_thread(write)
            if failing:
                logger.info("Replica heartbeat: the database answers again")
            failing = False
        except Exception as exc:  # the database is down: say so once, keep serving
            if not failing:
                logger.warning("Replica heartbeat: cannot write to the database (%s)", exc)
            failing = True

    await attempt(register)
    try:
        while True:
            await asyncio.sleep(interval)
            await attempt(send)
    except asyncio.CancelledError:
        await asyncio.shield(attempt(lambda: send(draining=True)))
        raise
