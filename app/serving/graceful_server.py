"""A uvicorn Server whose SIGTERM/SIGINT drains first: refuse new requests, let the ones in
flight finish within the shutdown timeout, abort the rest, then exit 0. If the engine does not
load, it stops on its own (the serve command then exits non-zero).

A server on its own keeps listening while it drains and answers new requests 503 with a
sentence saying why. A replica behind a router stops listening at once instead: the router's
next connection is refused, and a refused connection is the one failure a router retries on
another replica without doubt (the request never arrived), so the replica's people are served
elsewhere at once rather than told 503 until its health check fails."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from types import FrameType

import uvicorn

from officellm.app.admission.admission import AdmissionControl
from officellm.engine import LoadFailure

logger = logging.getLogger("officellm.server")


class GracefulServer(uvicorn.Server):
    """uvicorn.Server with a drain phase before uvicorn's own shutdown.

    Uvicorn on its own stops listening at once (new clients get "connection refused", not a
    503) and re-raises the signal after shutdown (exit status 143, not 0). With
    `stop_listening_on_drain` (a replica behind a router) it stops listening at once too, and
    closes its idle keep-alive connections; the busy ones close after their answer.
    """

    def __init__(self, config: uvicorn.Config, admission: AdmissionControl,
                 abort_all: Callable[[], None], shutdown_timeout: float,
                 stop_listening_on_drain: bool = False):
        super().__init__(config)
        self.stop_listening_on_drain = stop_listening_on_drain
        self.admission = admission
        self.abort_all = abort_all  # every engine's requests, when the drain times out
        self.shutdown_timeout = shutdown_timeout
        self._signalled = False
        self._drain_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.load_failure: LoadFailure | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def engine_failed(self, failure: LoadFailure) -> None:
        """The engine did not load (AsyncLLM.on_load_failure; called on its thread): stop
        serving. Nothing is left to drain: no request was ever admitted."""
        self.load_failure = failure
        if self._loop is None:  # not serving yet: main_loop will see the failure
            return
        try:
            self._loop.call_soon_threadsafe(self._exit_failed)
        except RuntimeError:  # the loop has closed: the server is done anyway
            pass

    def _exit_failed(self) -> None:
        # Only once started: older uvicorns (the pin allows 0.29) skip their shutdown, and so
        # the app's lifespan shutdown, when should_exit is already set as startup ends.
        if self.started:
            self.should_exit = True

    async def main_loop(self) -> None:
        if self.load_failure is not None:  # it failed while uvicorn was starting up
            self.should_exit = True
        await super().main_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs as a Python signal handler on the event loop's thread, between callbacks.
        if self._signalled:
            if sig == signal.SIGINT:  # a second Ctrl+C: stop now
                logger.warning("Second interrupt: exiting without waiting")
                self.admission.draining = True
                self.should_exit = True
                self.force_exit = True
            return
        self._signalled = True
        logger.info("Received %s: draining (timeout %.0f s)", signal.Signals(sig).name,
                    self.shutdown_timeout)
        self.admission.draining = True  # admission stops now, before the task even runs
        # Signal handlers may run in the middle of the loop's own code: schedule, don't act.
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self.stop_listening_on_drain:
            for server in self.servers:
                server.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()  # idle: closed now; busy: closed after its answer
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.admission.drain(self.shutdown_timeout, self.abort_all)
        finally:
            self.should_exit = True
