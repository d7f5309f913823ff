"""create_app: the FastAPI app over an AsyncEngine."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.async_engine import AsyncEngine
from app.auth import make_authenticator
from app.errors import install_error_handlers
from app.lifecycle import Lifecycle
from app.metrics import ServerMetrics
from app.routes import chat, completions, models, system
from app.settings import ServerSettings
from app.state import ServerState
from engine import LLMEngine

logger = logging.getLogger("officellm.server")

EngineFactory = Callable[[], LLMEngine]


def default_engine_factory(settings: ServerSettings) -> EngineFactory:
    """Build the real engine from the settings (called on the engine thread)."""
    return lambda: LLMEngine(settings.engine_config())


def create_app(settings: ServerSettings, engine_factory: EngineFactory | None = None) -> FastAPI:
    """The OpenAI-compatible app. The engine loads in the background once the app starts
    (its lifespan), so /health answers 503 while loading and 200 when ready."""
    factory = engine_factory or default_engine_factory(settings)
    async_engine = AsyncEngine(factory)
    # The model's name is known once loaded; `state` is bound below, before any scrape.
    server_metrics = ServerMetrics(async_engine, lambda: state.model_name)
    async_engine.listener = server_metrics.latency_tracker()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            async_engine.abort_all()
            async_engine.stop(timeout=10.0)

    state = ServerState(settings=settings, async_engine=async_engine, metrics=server_metrics,
                        lifecycle=Lifecycle(async_engine), created=int(time.time()))
    app = FastAPI(title="officellm", version="0.1.0", lifespan=lifespan)
    app.state.server = state
    # The policies issue swaps this for DB-backed per-user keys (see app/auth.py).
    app.state.authenticator = make_authenticator(settings.api_keys)
    install_error_handlers(app)
    for module in (chat, completions, models, system):
        app.include_router(module.router)
    return app
