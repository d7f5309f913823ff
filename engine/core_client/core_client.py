"""EngineCoreClient: the engine core as AsyncLLM drives it, wherever the core runs (vLLM v1's
EngineCoreClient). AsyncLLM's lifecycle thread calls load(), then serve() until the core
stops; the event loop sends requests, aborts, purges and stop() meanwhile."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.frontend.front_end import EngineFrontEnd
from officellm.engine.model_lifecycle import EngineCoreDied, EngineLoadError
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

# Called with each step's outputs and the stats after it (also with no outputs when idle;
# None: the stats have not changed).
StepCallback = Callable[[list[EngineCoreOutput], EngineStats | None], None]


class GrammarInCore:
    """A request's grammar when its core compiles it (a core in a process of its own): the
    request's structured_outputs travel, and the core compiles them again, from its cache,
    since compile_grammar() compiled them there already."""


GRAMMAR_IN_CORE = GrammarInCore()


@dataclass(frozen=True)
class LoadedCore:
    """A core that has loaded: the front end for its model, and its first stats."""

    front_end: EngineFrontEnd
    stats: EngineStats


__all__ = ["EngineCoreClient", "EngineCoreDied", "EngineLoadError", "GRAMMAR_IN_CORE",
           "LoadedCore", "StepCallback"]


class EngineCoreClient(Protocol):
    """One engine core's life: load, serve, stop, close; and the commands it takes while it
    serves. Commands are thread-safe and never block on a step."""

    # The process the core runs in, when it has one of its own (None: this process).
    pid: int | None

    def load(self) -> LoadedCore:
        """Load the model (blocking, on the lifecycle thread); raise what the load raised."""
        ...

    def serve(self, on_step: StepCallback) -> None:
        """Run steps until stop(); raise EngineCoreDied (or the loop's exception) if the
        core stops otherwise. Requests still queued get nothing more from it."""
        ...

    def close(self) -> None:
        """Free the core after serve() has returned (idempotent)."""
        ...

    def stop(self) -> None:
        """Tell serve() to return after the commands already sent."""
        ...

    def add_requests(self, requests: list[EngineCoreRequest]) -> None: ...

    def abort_requests(self, core_ids: list[str]) -> None: ...

    def purge_cache_salt(self, cache_salt: str | None) -> concurrent.futures.Future[int]:
        """Forget the cached blocks computed under this salt (pool and tiers); how many
        of the pool's were dropped, once the core has done it (0 if it stops first)."""
        ...

    def compile_grammar(self, params: StructuredOutputsParams) -> object:
        """Compile a structured-output spec (blocking: call it off the event loop) and
        return what add_requests takes as a request's `grammar`. Raises
        StructuredOutputError for a spec that cannot be honoured."""
        ...
