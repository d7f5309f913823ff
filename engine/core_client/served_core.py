"""The core an engine process serves (engine_process.py is its entry point): the model
loaded from the server's Start, then steps run until the server says stop or goes; commands
come in on a thread of their own, each step's outputs and stats go out (wire.py)."""

from __future__ import annotations

import logging
import socket
import threading

import torch

from officellm.engine.config import EngineConfig
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.core_client import wire
from officellm.engine.core_client.channel import Channel
from officellm.engine.core_client.child_process import child_logging
from officellm.engine.core_client.inproc_client import InprocCoreClient
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.model_lifecycle import REFUSALS, LoadFailure
from officellm.engine.structured_output import StructuredOutputError

logger = logging.getLogger("officellm.engine_process")


class ServedCore:
    """The engine process's core: an InprocCoreClient fed by the socket."""

    def __init__(self, channel: Channel, config: EngineConfig) -> None:
        self.channel = channel
        self.client = InprocCoreClient(lambda: LLMEngine(config))

    @classmethod
    def load(cls, fd: int) -> ServedCore | None:
        """Read the server's Start from socket `fd`, load the model and say Ready; None if
        it did not load (the server has been told why)."""
        channel = Channel(socket.socket(fileno=fd), wire.ToEngine)
        start = channel.receive()
        if not isinstance(start, wire.Start):
            return None
        child_logging(start.log_level, start.label)
        served = cls(channel, start.config)
        try:
            loaded = served.client.load()
        except BaseException as exc:  # noqa: BLE001 - the server hears why, in one line
            failure = LoadFailure.of(exc)
            if not isinstance(exc, REFUSALS):  # a bug: its traceback is only here
                logger.error("Loading the engine failed", exc_info=exc)
            channel.send(wire.LoadFailed(failure.reason))
            return None
        channel.send(wire.Ready(loaded.front_end.info, loaded.stats))
        return served

    def serve(self) -> int:
        """Run steps until the server says stop or goes; the process's exit status."""
        # The model loaded on another thread: OpenMP's thread count is per thread, so this
        # one (the kernels' parallel regions start here) takes the count the load set.
        torch.set_num_threads(torch.get_num_threads())
        threading.Thread(target=self._receive, name="engine-commands", daemon=True).start()
        try:
            self.client.serve(lambda outputs, stats: self.channel.send(wire.Step(outputs, stats)))
        except BaseException:
            logger.exception("The engine loop died")
            return 1
        finally:
            self.client.close()
        self.channel.send(wire.Stopped())
        return 0

    def _receive(self) -> None:
        """Commands from the server, until it says stop or goes."""
        while True:
            message = self.channel.receive()
            if message is None or isinstance(message, wire.Stop):
                self.client.stop()
                return
            if isinstance(message, wire.Add):
                self._add(message.requests)
            elif isinstance(message, wire.Abort):
                self.client.abort_requests(message.core_ids)
            elif isinstance(message, wire.Purge):
                self._purge(message)
            elif isinstance(message, wire.Compile):
                # Off this thread: a new spec may take seconds, and aborts must not wait.
                threading.Thread(target=self._compile, args=(message,), daemon=True).start()

    def _add(self, requests: list[wire.WireRequest]) -> None:
        ready, failed = [], []
        for r in requests:
            spec = r.params.structured_outputs
            try:
                # The server compiled it here first (Compile), so this is the cache's.
                grammar = None if spec is None else self.client.compile_grammar(spec)
            except StructuredOutputError as exc:
                failed.append(EngineCoreOutput(r.request_id, [], finish_reason="error",
                                               error=str(exc)))
                continue
            ready.append(r.core_request(grammar))
        if ready:
            self.client.add_requests(ready)
        if failed:
            self.channel.send(wire.Step(failed, None))

    def _purge(self, message: wire.Purge) -> None:
        def answer(done) -> None:
            error = done.exception()
            self.channel.send(wire.Purged(message.call, 0 if error else done.result(),
                                          None if error is None else str(error)))
        self.client.purge_cache_salt(message.cache_salt).add_done_callback(answer)

    def _compile(self, message: wire.Compile) -> None:
        try:
            self.client.compile_grammar(message.params)
            error = None
        except StructuredOutputError as exc:
            error = str(exc)
        self.channel.send(wire.Compiled(message.call, error))
