"""Admission and graceful shutdown: stop admitting, let in-flight requests finish, abort the rest."""

from __future__ import annotations

import asyncio
import logging
import time

from app.async_engine import AsyncEngine

logger = logging.getLogger("officellm.server")


class Lifecycle:
    """Counts generation requests in flight and drains them at shutdown.

    Lives on the event loop; not thread-safe (it need not be).
    """

    def __init__(self, async_engine: AsyncEngine) -> None:
        self._engine = async_engine
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        """One more generation request in flight (call after admission checks passed)."""
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Stop admitting; wait up to `timeout` s for in-flight requests, then abort the rest.

        Returns True if everything finished in time.
        """
        self.draining = True
        t0 = time.monotonic()
        if self.in_flight:
            logger.info("Shutting down: no new requests; waiting up to %.0f s for %d in flight",
                        timeout, self.in_flight)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            logger.warning("Shutdown timeout (%.0f s): aborting %d requests still in flight",
                           timeout, self.in_flight)
            self._engine.abort_all()
            try:  # give the aborted requests' handlers a moment to answer and leave
                await asyncio.wait_for(self._idle.wait(), 5.0)
            except asyncio.TimeoutError:
                pass
            return False
        logger.info("In-flight requests finished in %.1f s", time.monotonic() - t0)
        return True
