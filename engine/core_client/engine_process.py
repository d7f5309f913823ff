"""The engine process: one model's engine core, started by the server
(`python -m officellm.engine.core_client.engine_process FD PARENT_PID`), spoken to over the
socket FD (wire.py). It loads the model, says Ready (or why not), then runs steps until told
to stop, the server goes, or it dies; the server's side is process_client.py.

It dies with the server: the kernel kills it when the thread that started it ends
(PR_SET_PDEATHSIG), and it stops when the socket closes. SIGINT and SIGTERM are the server's
to act on (it drains, then stops its engines), so the process ignores them.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading

from officellm.engine.config import EngineConfig
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.core_client import wire
from officellm.engine.core_client.channel import Channel
from officellm.engine.core_client.child_process import child_logging, die_with_parent
from officellm.engine.core_client.inproc_client import InprocCoreClient
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.model_lifecycle import REFUSALS, LoadFailure
from officellm.engine.structured_output import StructuredOutputError

logger = logging.getLogger("officellm.engine_process")


class EngineProcess:
    """The child's side: an InprocCoreClient fed by the socket."""

    def __init__(self, channel: Channel, config: EngineConfig) -> None:
        self.channel = channel
        self.client = InprocCoreClient(lambda: LLMEngine(config))

    def run(self) -> int:
        try:
            loaded = self.client.load()
        except BaseException as exc:  # noqa: BLE001 - the server hears why, in one line
            failure = LoadFailure.of(exc)
            if not isinstance(exc, REFUSALS):  # a bug: its traceback is only here
                logger.error("Loading the engine failed", exc_info=exc)
            self.channel.send(wire.LoadFailed(failure.reason))
            return 1
        self.channel.send(wire.Ready(loaded.front_end.info, loaded.stats))
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


def main(argv: list[str]) -> int:
    fd, parent_pid = int(argv[0]), int(argv[1])
    die_with_parent(parent_pid)
    channel = Channel(socket.socket(fileno=fd), wire.ToEngine)
    start = channel.receive()
    if not isinstance(start, wire.Start):
        return 1
    child_logging(start.log_level, start.label)
    return EngineProcess(channel, start.config).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
