"""A uvicorn Server whose SIGTERM/SIGINT drains first: refuse new requests with 503, let the
ones in flight finish within the shutdown timeout, abort the rest, then exit 0."""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from app.lifecycle import Lifecycle

logger = logging.getLogger("officellm.server")


class GracefulServer(uvicorn.Server):
    """uvicorn.Server with a drain phase before uvicorn's own shutdown.

    Uvicorn on its own stops listening at once (new clients get "connection refused", not a
    503) and re-raises the signal after shutdown (exit status 143, not 0).
    """

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, shutdown_timeout: float):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.shutdown_timeout = shutdown_timeout
        self._signalled = False
        self._drain_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs as a Python signal handler on the event loop's thread, between callbacks.
        if self._signalled:
            if sig == signal.SIGINT:  # a second Ctrl+C: stop now
                logger.warning("Second interrupt: exiting without waiting")
                self.lifecycle.draining = True
                self.should_exit = True
                self.force_exit = True
            return
        self._signalled = True
        logger.info("Received %s: draining (timeout %.0f s)", signal.Signals(sig).name,
                    self.shutdown_timeout)
        self.lifecycle.draining = True  # admission stops now, before the task even runs
        # Signal handlers may run in the middle of the loop's own code: schedule, don't act.
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.lifecycle.drain(self.shutdown_timeout)
        finally:
            self.should_exit = True
